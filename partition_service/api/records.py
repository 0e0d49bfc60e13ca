"""Produce, fetch, offsets and DescribeProducers for one partition."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from partition_service.context import Node
from sdk.protocol.common import MAX_PARTITIONS_PER_TOPIC, TOPIC_NAME_PATTERN, TopicPartition
from sdk.protocol.node import (
    DescribeProducersResponse,
    FetchResponse,
    IsolationLevel,
    PartitionOffsets,
    ProduceRequest,
    ProduceResponse,
)
from sdk.protocol.server import error_responses

router = APIRouter(prefix="/v1/partitions/{topic}/{partition}", tags=["records"])

TopicPath = Annotated[str, Path(pattern=TOPIC_NAME_PATTERN, description="Topic name.")]
PartitionPath = Annotated[
    int, Path(ge=0, lt=MAX_PARTITIONS_PER_TOPIC, description="Partition index.")
]


def json_response(body: object) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


@router.post(
    "/records",
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
    ),
)
async def produce_records(
    topic: TopicPath, partition: PartitionPath, body: ProduceRequest, node: Node
) -> Response:
    """Acknowledged only once durable. A retried batch (same producer, epoch and sequence)
    answers ``duplicate: true`` with the offsets it got the first time."""
    target = node.registry.get(topic, partition)
    rows = target.validate_rows(body)
    if body.transactional:
        assert body.producer_id is not None and body.producer_epoch is not None
        if target.needs_verification(body.producer_id, body.producer_epoch):
            await node.verifier.verify(
                body.producer_id,
                body.producer_epoch,
                TopicPartition(topic=topic, partition=partition),
            )
    result = target.append(body, rows)
    await target.wait_durable(result)
    if result.duplicate:
        node.metrics.duplicate_batches.inc()
    else:
        node.metrics.produced_records.labels(topic).inc(len(rows))
    return json_response(
        {
            "base_offset": result.base_offset,
            "last_offset": result.last_offset,
            "duplicate": result.duplicate,
            "log_append_time_ms": result.append_time_ms,
        }
    )


@router.get(
    "/records",
    operation_id="fetchRecords",
    summary="Read records from an offset",
    response_model=FetchResponse,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION", "OFFSET_OUT_OF_RANGE"),
)
async def fetch_records(
    topic: TopicPath,
    partition: PartitionPath,
    node: Node,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="First offset wanted.")] = 0,
    max_records: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    max_bytes: Annotated[int, Query(ge=1, le=64 * 1024 * 1024)] = 1024 * 1024,
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    max_wait_ms: Annotated[
        int, Query(ge=0, le=60_000, description="Wait this long for records (long poll).")
    ] = 0,
) -> Response:
    """Control records are never returned. ``read_committed`` stops at the last stable
    offset and leaves out records of aborted transactions; follow ``next_offset``."""
    target = node.registry.get(topic, partition)
    read_committed = isolation_level is IsolationLevel.READ_COMMITTED
    result = await target.fetch(
        offset,
        max_records=max_records,
        max_bytes=max_bytes,
        read_committed=read_committed,
        max_wait_ms=max_wait_ms,
    )
    node.metrics.fetched_records.labels(isolation_level.value).inc(len(result.records))
    engine = target.engine
    return json_response(
        {
            "records": result.records,
            "next_offset": result.next_offset,
            "high_watermark": engine.high_watermark,
            "last_stable_offset": engine.last_stable_offset,
            "log_start_offset": engine.log_start_offset,
        }
    )


@router.get(
    "/offsets",
    operation_id="getPartitionOffsets",
    summary="Log start, high watermark and last stable offset",
    response_model=PartitionOffsets,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION"),
)
async def partition_offsets(topic: TopicPath, partition: PartitionPath, node: Node) -> Response:
    return json_response(node.registry.get(topic, partition).offsets())


@router.get(
    "/producers",
    operation_id="describeProducers",
    summary="Producers with state on this partition (DescribeProducers)",
    response_model=DescribeProducersResponse,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION"),
)
async def describe_producers(topic: TopicPath, partition: PartitionPath, node: Node) -> Response:
    engine = node.registry.get(topic, partition).engine
    return json_response(
        {
            "producers": [
                {
                    "producer_id": entry.producer_id,
                    "producer_epoch": entry.epoch,
                    "last_sequence": entry.last_sequence,
                    "coordinator_epoch": entry.coordinator_epoch,
                    "current_txn_start_offset": entry.current_txn_first_offset,
                    "last_timestamp_ms": entry.last_timestamp_ms,
                }
                for entry in engine.producers.producers.values()
            ]
        }
    )
