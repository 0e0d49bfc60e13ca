"""Produce, fetch, offsets and DescribeProducers for one partition.

Produce is the call every batch makes: ``FAST_PATHS`` answers it without FastAPI's
per-request work (``eos_server/fastpath.py``); the route stays its declaration.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import (
    MAX_PARTITIONS_PER_TOPIC,
    TOPIC_NAME_PATTERN,
    TopicPartition,
)
from eos_protocol.node import (
    DescribeProducersResponse,
    FetchResponse,
    IsolationLevel,
    PartitionOffsets,
    ProduceRequest,
    ProduceResponse,
)
from eos_protocol.parsing import collector_paused
from eos_security.access import Caller, principal_of
from eos_server.envelope import error_responses
from eos_server.fastpath import Decline, FastCall, fast_path
from partition_service.context import Node, NodeContext
from partition_service.log.engine import AppendResult, ReadResult, Row
from partition_service.partition import Partition

router = APIRouter(prefix="/v1/partitions/{topic}/{partition}", tags=["records"])
_AUTH = ("UNAUTHENTICATED", "TOPIC_AUTHORIZATION_FAILED")

TopicPath = Annotated[str, Path(pattern=TOPIC_NAME_PATTERN, description="Topic name.")]
PartitionPath = Annotated[
    int, Path(ge=0, lt=MAX_PARTITIONS_PER_TOPIC, description="Partition index.")
]


def json_response(body: object) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


async def produce_records(
    topic: TopicPath, partition: PartitionPath, body: ProduceRequest, node: Node, caller: Caller
) -> ProduceResponse:
    """Acknowledged only once durable. A retried batch (same producer, epoch, slot and
    sequence) answers ``duplicate: true`` with the offsets it got the first time. Needs
    write on the topic."""
    await node.access.require(caller, ResourceType.TOPIC, topic, Operation.WRITE)
    target = node.registry.get(topic, partition)
    return _answer(await append_batch(node, target, body, target.validate_rows(body), caller))


router.add_api_route(
    "/records",
    produce_records,
    methods=["POST"],
    operation_id="produceRecords",
    summary="Append one batch of records",
    response_model=ProduceResponse,
    responses=error_responses(
        "INVALID_REQUEST",
        "INVALID_RECORD",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_PRODUCER_ID",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "TRANSACTION_ABORTABLE",
        "MESSAGE_TOO_LARGE",
        "COORDINATOR_NOT_AVAILABLE",
        "CONCURRENT_TRANSACTIONS",
        "KAFKA_STORAGE_ERROR",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "UNAUTHENTICATED",
        "TOPIC_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    ),
)


@fast_path(produce_records, ProduceRequest)
async def produce_records_fast(call: FastCall[ProduceRequest]) -> ProduceResponse:
    """The produce route without FastAPI's per-request work (``eos_server/fastpath.py``).

    The batch is parsed from the body bytes with the cyclic collector paused until its
    per-record models are turned into rows and freed (``collector_paused``): the parse is
    the node's largest burst of allocations. The topic right is therefore looked at first,
    without waiting (``allowed``): a caller it does not certainly admit goes to the route,
    which validates the body before it asks, as FastAPI orders them.
    """
    topic, index = call.text("topic"), call.number("partition")
    node: NodeContext = call.state.node
    caller = principal_of(call.scope)
    if not node.access.allowed(caller, ResourceType.TOPIC, topic, Operation.WRITE):
        raise Decline
    with collector_paused():
        body = call.body()
        target = node.registry.get(topic, index)
        rows = target.validate_rows(body, body_bytes=len(call.raw))
        # Free the per-record models now, while the collector is paused.
        body = body.model_copy(update={"records": []})
    return _answer(await append_batch(node, target, body, rows, caller))


FAST_PATHS = (produce_records_fast,)


def _answer(result: AppendResult) -> ProduceResponse:
    return ProduceResponse(
        base_offset=result.base_offset,
        last_offset=result.last_offset,
        duplicate=result.duplicate,
        log_append_time_ms=result.append_time_ms,
    )


async def append_batch(
    node: NodeContext,
    target: Partition,
    body: ProduceRequest,
    rows: list[Row],
    caller: str | None,
) -> AppendResult:
    """Append a validated batch (``body`` gives the producer fields, ``rows`` the records)
    and answer once it is durable. A batch that opens a transaction here is verified with
    the coordinator (KIP-890) — or, for a producer of transaction version 2, its partition
    is added to the transaction there first — which also names its transactional id: the
    caller must hold write on it, as Kafka checks on a transactional produce."""
    acks_all = body.acks == -1
    # Leadership first, before the coordinator is asked: a leader cut off from the
    # coordinators stops leading after its session timeout, and its producers must hear
    # NOT_LEADER_OR_FOLLOWER, which makes them look the new leader up, not the
    # COORDINATOR_NOT_AVAILABLE of a verification it cannot make, which they would retry
    # here until the cut heals. Checked again at the append (``_verified_append``).
    target.role.require_leader(acks_all=acks_all)
    verify = False
    if body.transactional:  # validate_rows saw to the producer fields
        assert body.producer_id is not None and body.producer_epoch is not None
        verify = target.needs_verification(body.producer_id, body.producer_epoch)
    if verify:
        result = await _verified_append(node, target, body, rows, caller, acks_all=acks_all)
    else:
        result = target.append(body, rows)
    await target.wait_durable(result, acks_all=acks_all)
    if result.duplicate:
        node.metrics.duplicate_batches.inc()
    else:
        node.metrics.produced_records.labels(target.topic).inc(len(rows))
    return result


async def _verified_append(
    node: NodeContext,
    target: Partition,
    body: ProduceRequest,
    rows: list[Row],
    caller: str | None,
    *,
    acks_all: bool,
) -> AppendResult:
    """Verify the batch, then append it in the same step of the event loop as the last
    checks: the verification guard (under transaction version 1, no marker for the
    producer arrived meanwhile), and leadership, which may have moved during the round
    trip."""
    assert body.producer_id is not None and body.producer_epoch is not None
    with target.verifications.guard(body.producer_id) as guard:
        verified = await node.verifier.verify(
            body.producer_id,
            body.producer_epoch,
            TopicPartition(topic=target.topic, partition=target.index),
        )
        if verified.transactional_id is not None:
            await node.access.require(
                caller, ResourceType.TRANSACTIONAL_ID, verified.transactional_id, Operation.WRITE
            )
        target.verifications.check(guard, body.producer_id, verified.transaction_version)
        target.role.require_leader(acks_all=acks_all)
        return target.append(body, rows)


@router.get(
    "/records",
    operation_id="fetchRecords",
    summary="Read records from an offset",
    response_model=FetchResponse,
    responses=error_responses(
        "UNKNOWN_TOPIC_OR_PARTITION", "OFFSET_OUT_OF_RANGE", "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE", *_AUTH,
    ),
)
async def fetch_records(
    topic: TopicPath,
    partition: PartitionPath,
    node: Node,
    caller: Caller,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="First offset wanted.")] = 0,
    max_records: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    max_bytes: Annotated[int, Query(ge=1, le=64 * 1024 * 1024)] = 1024 * 1024,
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    max_wait_ms: Annotated[
        int, Query(ge=0, le=60_000, description="Wait this long for records (long poll).")
    ] = 0,
) -> Response:
    """Control records are never returned. ``read_committed`` stops at the last stable
    offset and leaves out records of aborted transactions; follow ``next_offset``. Needs
    read on the topic."""
    await node.access.require(caller, ResourceType.TOPIC, topic, Operation.READ)
    target = node.registry.get(topic, partition)
    target.role.require_leader()  # consumers read from the leader
    engine = target.engine
    fetched = node.metrics.fetched_records.labels(isolation_level.value)

    def render(result: ReadResult) -> Response:
        fetched.inc(len(result.records))
        return json_response(
            {
                "records": result.records,
                "next_offset": result.next_offset,
                "high_watermark": engine.high_watermark,
                "last_stable_offset": engine.last_stable_offset,
                "log_start_offset": engine.log_start_offset,
            }
        )

    return await target.fetch(
        offset,
        max_records=max_records,
        max_bytes=max_bytes,
        read_committed=isolation_level is IsolationLevel.READ_COMMITTED,
        max_wait_ms=max_wait_ms,
        render=render,
    )


@router.get(
    "/offsets",
    operation_id="getPartitionOffsets",
    summary="Log start, high watermark and last stable offset",
    response_model=PartitionOffsets,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION", *_AUTH),
)
async def partition_offsets(
    topic: TopicPath, partition: PartitionPath, node: Node, caller: Caller
) -> Response:
    await node.access.require(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    return json_response(node.registry.get(topic, partition).offsets())


@router.get(
    "/producers",
    operation_id="describeProducers",
    summary="Producers with state on this partition (DescribeProducers)",
    response_model=DescribeProducersResponse,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION", *_AUTH),
)
async def describe_producers(
    topic: TopicPath,
    partition: PartitionPath,
    node: Node,
    caller: Caller,
    slot: Annotated[
        int,
        Query(
            ge=0,
            le=2**31 - 1,
            description="The slot whose last sequence each producer's last_sequence is "
            "(ProduceRequest.slot); 0, a producer's single sequence, when absent.",
        ),
    ] = 0,
) -> Response:
    """One row per producer id; ``last_sequence`` is of the asked ``slot`` (-1 when the
    producer wrote nothing there at its current epoch): a retried task that writes in a
    slot of a shared producer asks how far its own slot got."""
    await node.access.require(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    return json_response({"producers": producer_rows(node.registry.get(topic, partition), slot)})


def producer_rows(target: Partition, slot: int) -> list[dict[str, object]]:
    """A partition's producers as DescribeProducers answers them (``ProducerDescription``),
    ``last_sequence`` of ``slot``: the per-partition GET's rows, and each entry's of the
    request of many partitions (``api/describe_producers.py``)."""
    return [
        {
            "producer_id": entry.producer_id,
            "producer_epoch": entry.epoch,
            "last_sequence": entry.last_sequence_of(slot),
            "slot": slot,
            "coordinator_epoch": entry.coordinator_epoch,
            "current_txn_start_offset": entry.current_txn_first_offset,
            "last_timestamp_ms": entry.last_timestamp_ms,
            "current_txn_start_ms": entry.current_txn_start_ms,
        }
        for entry in target.engine.producers.producers.values()
    ]
