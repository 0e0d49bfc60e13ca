"""Endpoints for coordinators only: transaction markers, partition creation (one at a
time, or many in one request), the removal of deleted topics' replicas, the controller's
batched partition states, and the open transactions the hanging-transaction detector
compares with its own state.

Every route here requires the cluster's internal token (checked in constant time); a
request without it is refused before anything is read or written.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, topic_name_problem
from eos_protocol.errors import EosError, InvalidRequestError
from eos_protocol.hanging import OpenTransactionsResponse
from eos_protocol.node import (
    CreatePartitionRequest,
    CreatePartitionResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    DeleteTopicsOnNodeRequest,
    DeleteTopicsOnNodeResponse,
    ListPartitionsResponse,
    MarkerPartitionResult,
    RecordIn,
    WriteMarkersRequest,
    WriteMarkersResponse,
)
from eos_protocol.replication import PartitionStatesAnswer, PartitionStatesPush
from eos_server.envelope import error_responses
from eos_server.fastpath import FastCall, fast_path
from eos_server.logs import txn_fields
from partition_service.api.records import PartitionPath, TopicPath, json_response
from partition_service.context import Node, NodeContext
from partition_service.log.group_offsets import encode_offset_key
from partition_service.partition import Partition, now_ms
from partition_service.registry import NewPartition
from partition_service.replication.role import Assignment

log = logging.getLogger("eos.node.markers")
replication_log = logging.getLogger("eos.node.replication")
deletion_log = logging.getLogger("eos.node.topic_deletion")

#: How long the batched state push works on the event loop before it lets other work run.
PUSH_SLICE_S = 0.02


async def require_internal_token(request: Request) -> None:
    await request.app.state.internal_check(request)


router = APIRouter(
    prefix="/internal/v1",
    tags=["internal"],
    dependencies=[Depends(require_internal_token)],
)


@router.post(
    "/markers",
    operation_id="writeTxnMarkers",
    summary="Write COMMIT/ABORT markers (coordinators only)",
    response_model=WriteMarkersResponse,
    responses=error_responses(
        "INVALID_REQUEST", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "MESSAGE_TOO_LARGE"
    ),
)
async def write_markers(body: WriteMarkersRequest, node: Node) -> WriteMarkersResponse:
    """Each partition answers on its own: one failing partition does not hold back the
    others. All markers are appended first, then one group commit makes them durable."""
    jobs: list[tuple[int, str, int, asyncio.Future[None] | EosError]] = []
    for marker in body.markers:
        for tp in marker.partitions:
            try:
                target = node.registry.get(tp.topic, tp.partition)
                job: asyncio.Future[None] | EosError = asyncio.ensure_future(
                    target.write_marker(
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.coordinator_epoch,
                        marker.result.value,
                    )
                )
            except EosError as exc:
                job = exc
            jobs.append((marker.producer_id, tp.topic, tp.partition, job))
            node.metrics.markers.labels(marker.result.value).inc()
    results = []
    epochs = {
        m.producer_id: (m.producer_epoch, m.coordinator_epoch, m.result.value) for m in body.markers
    }
    for producer_id, topic, partition, job in jobs:
        error: str | None = None
        if isinstance(job, EosError):
            error = job.code
        else:
            try:
                await job
            except EosError as exc:
                error = exc.code
        epoch, coordinator_epoch, result = epochs[producer_id]
        log.log(
            logging.WARNING if error else logging.DEBUG,
            "marker %s for producer %d on %s-%d: %s",
            result,
            producer_id,
            topic,
            partition,
            error or "written",
            extra=txn_fields(
                None,
                producer_id,
                epoch,
                topic=topic,
                partition=partition,
                coordinator_epoch=coordinator_epoch,
                result=result,
                error=error,
            ),
        )
        results.append(
            MarkerPartitionResult(
                producer_id=producer_id, topic=topic, partition=partition, error=error
            )
        )
    return WriteMarkersResponse(results=results)


@fast_path(write_markers, WriteMarkersRequest)
async def write_markers_fast(call: FastCall[WriteMarkersRequest]) -> WriteMarkersResponse:
    """Every commit's markers come through here: answered without FastAPI's per-request
    work (``eos_server/fastpath.py``); the router's internal-token check runs on it as
    on the route."""
    node: NodeContext = call.state.node
    return await write_markers(call.body(), node)


FAST_PATHS = (write_markers_fast,)


#: A creation without a body (a coordinator of an earlier version): one replica.
_NO_REPLICAS = Body(default_factory=CreatePartitionRequest)


@router.put(
    "/partitions/{topic}/{partition}",
    operation_id="createPartition",
    summary="Create a partition on this node (coordinators only)",
    response_model=CreatePartitionResponse,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def create_partition(
    topic: TopicPath,
    partition: PartitionPath,
    node: Node,
    body: CreatePartitionRequest = _NO_REPLICAS,
) -> Response:
    # Idempotent. A name no topic may have (``.``, ``..``: the path pattern lets them
    # through, a percent-encoded request carries them) is refused with INVALID_REQUEST
    # (400, documented for every operation) before anything touches the disk, so the
    # coordinator records a refusal instead of taking the node for away. A partition of
    # several replicas waits for the controller's assignment before it serves as leader.
    problem = topic_name_problem(topic)
    if problem is not None:
        raise InvalidRequestError(f"cannot create a partition of topic {topic!r}: {problem}")
    replicated = len(set(body.replicas)) > 1
    created = await node.registry.create(topic, partition, replicated=replicated)
    return json_response({"topic": topic, "partition": partition, "created": created})


@router.post(
    "/partitions",
    operation_id="createPartitions",
    summary="Create many partitions on this node (coordinators only)",
    response_model=CreatePartitionsResponse,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def create_partitions(body: CreatePartitionsRequest, node: Node) -> Response:
    """The batched ``createPartition``: each entry is answered on its own, by the same
    rules (an illegal topic name refuses that entry with INVALID_REQUEST and no other),
    and the data directory is fsynced once for the batch (``PartitionRegistry.create_many``).
    A coordinator asks a topic's partitions of a node in a few requests instead of one per
    partition; the one-partition route stays served for coordinators of older versions."""
    answers: list[dict[str, object]] = []
    wanted: list[NewPartition] = []
    for entry in body.partitions:
        answer: dict[str, object] = {"topic": entry.topic, "partition": entry.partition,
                                     "created": False, "error": None}  # fmt: skip
        problem = topic_name_problem(entry.topic)
        if problem is None:
            replicated = len(set(entry.replicas)) > 1
            wanted.append(NewPartition(entry.topic, entry.partition, replicated))
        else:
            refusal = InvalidRequestError(
                f"cannot create a partition of topic {entry.topic!r}: {problem}"
            )
            answer["error"] = {"code": refusal.code, "message": refusal.message}
        answers.append(answer)
    created = iter(await node.registry.create_many(wanted))
    for answer in answers:
        if answer["error"] is None:
            answer["created"] = next(created)
    return json_response({"partitions": answers})


def deletion_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be deleted on a node (None: it can). The offsets topic holds
    every group's committed offsets and no client can make it again: never removed."""
    problem = topic_name_problem(topic)
    if problem is None and topic == CONSUMER_OFFSETS_TOPIC:
        problem = "an internal topic cannot be deleted"
    return problem


@router.post(
    "/topics/delete",
    operation_id="deleteTopicsOnNode",
    summary="Remove every replica of deleted topics from this node (coordinators only)",
    response_model=DeleteTopicsOnNodeResponse,
    responses=error_responses(
        "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "KAFKA_STORAGE_ERROR",
        "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_OR_FOLLOWER",
    ),
)
async def delete_topics_on_node(body: DeleteTopicsOnNodeRequest, node: Node) -> Response:
    """A deleted topic leaves the coordinators' metadata first; their deleter then asks
    every node, again until each has answered, to remove its replicas. Idempotent: a
    topic this node holds nothing of (never had, or removed already) is answered
    ``partitions_deleted: 0``, not refused.

    One answer per topic, in the order asked, each on its own. An entry's error is a
    refusal the coordinator does not ask again: a name no topic may have, or the internal
    ``__consumer_offsets`` (INVALID_REQUEST). A storage failure fails the request whole
    instead (KAFKA_STORAGE_ERROR), so that it is asked again.

    The work is ``PartitionRegistry.delete_topics``: every partition of the topics leaves
    the registry first, is discarded (requests still holding it answered
    UNKNOWN_TOPIC_OR_PARTITION, its replication stopped, its files closed) in slices that
    let the heartbeat run, and its directory is renamed durably before the answer and
    removed on a worker thread after."""
    answers: list[dict[str, object]] = []
    wanted: list[str] = []
    for topic in body.topics:
        answer: dict[str, object] = {"topic": topic, "partitions_deleted": 0, "error": None}
        problem = deletion_problem(topic)
        if problem is None:
            wanted.append(topic)
        else:
            refusal = InvalidRequestError(f"cannot delete topic {topic!r}: {problem}")
            answer["error"] = {"code": refusal.code, "message": refusal.message}
        answers.append(answer)

    def stop_replication(partition: Partition) -> None:
        node.replicas.forget(partition.topic, partition.index)

    deleted: dict[str, int] = {}
    if wanted:
        deleted = await node.registry.delete_topics(wanted, on_removed=stop_replication)
    for topic, count in deleted.items():
        node.metrics.forget_topic(topic)
        level = logging.INFO if count else logging.DEBUG
        deletion_log.log(level, "deleted topic %s: %d partitions", topic, count,
                         extra={"topic": topic})  # fmt: skip
    if wanted:
        forgotten = await forget_group_offsets(node, set(wanted))
        if forgotten:
            deletion_log.info("removed %d committed group offsets of deleted topics %s",
                              forgotten, ", ".join(sorted(wanted)))  # fmt: skip
    for answer in answers:
        if answer["error"] is None:
            answer["partitions_deleted"] = deleted[str(answer["topic"])]
    return json_response({"topics": answers})


async def forget_group_offsets(node: NodeContext, topics: set[str]) -> int:
    """Write a tombstone for every group's committed offset of ``topics`` in each
    ``__consumer_offsets`` partition led here, acks=all as an offset commit; returns how
    many. Kafka's group coordinator drops the offsets of deleted partitions, and without
    it a topic made again under the name would be read by an old group from the deleted
    topic's offsets on, skipping what lies below them. The other nodes, asked the same,
    do it for the partitions they lead. A failure (too few in-sync replicas, a storage
    error) fails the request, which the coordinator asks again: until it is answered the
    name cannot be created again."""
    forgotten = 0
    for (topic, _index), partition in list(node.registry.partitions.items()):
        view = partition.engine.groups
        if topic != CONSUMER_OFFSETS_TOPIC or view is None or not partition.role.leads:
            continue
        keys = view.keys_of_topics(topics)
        step = partition.limits.max_batch_records
        for start in range(0, len(keys), step):
            partition.role.require_leader(acks_all=True)
            tombstones = [RecordIn(key=encode_offset_key(*key)) for key in keys[start:start + step]]
            result = partition.append_rows(partition.rows(tombstones))
            await partition.wait_durable(result)
        forgotten += len(keys)
    return forgotten


@router.put(
    "/partition-states",
    operation_id="pushPartitionStates",
    summary="The controller's new assignments of many partitions (LeaderAndIsr)",
    response_model=PartitionStatesAnswer,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def push_partition_states(body: PartitionStatesPush, node: Node) -> Response:
    """The batched ``pushPartitionState``: the controller sends each node the states that
    changed together (a topic's creation, a node's failover) in one request, and each
    state is applied on its own as the one-partition route applies it. A partition not on
    this node is answered ``applied: false``, not refused: the node may create it only
    later (or, as a follower whose disk was replaced, here, by ``recreate_if_lost``).

    PUT, as the one-partition route: applying the same states again changes nothing (a
    node ignores a state older than the one it holds), so the request may be repeated.

    Taking the lead of a partition writes its leader-epoch file durably, milliseconds
    each: the states are applied in slices of ``PUSH_SLICE_S``, between which the node's
    other work (its heartbeat above all) runs. Applied at one go, the states of a new
    topic of a thousand partitions would hold the event loop for seconds, past the
    session timeout after which the controller takes the node for dead."""
    replicas = node.replicas
    replicas.nodes.update(body.nodes)
    answers = []
    slice_started = time.monotonic()
    for state in body.states:
        if time.monotonic() - slice_started > PUSH_SLICE_S:
            await asyncio.sleep(0)
            slice_started = time.monotonic()
        applied = False
        try:
            assignment = Assignment.of(state)
            await replicas.recreate_if_lost(state.topic, state.partition, assignment)
            applied = replicas.apply(state.topic, state.partition, assignment)
        except Exception as exc:  # one unusable state must not stop the others
            replication_log.warning(
                "an unusable pushed state of %s-%d: %s", state.topic, state.partition, exc,
                extra={"topic": state.topic, "partition": state.partition},
            )
        answers.append({"topic": state.topic, "partition": state.partition, "applied": applied})
    return json_response({"states": answers})


@router.get(
    "/partitions",
    operation_id="listNodePartitions",
    summary="Partitions on this node",
    response_model=ListPartitionsResponse,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def list_partitions(node: Node) -> Response:
    rows = []
    for (topic, index), target in sorted(node.registry.partitions.items()):
        rows.append({"topic": topic, "partition": index, **target.offsets(),
                     "log_end_offset": target.engine.log_end_offset})  # fmt: skip
    return json_response({"node_id": node.settings.node_id, "partitions": rows})


@router.get(
    "/open-transactions",
    operation_id="listOpenTransactions",
    summary="Open transactions on every partition this node leads (coordinators only)",
    response_model=OpenTransactionsResponse,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def open_transactions(node: Node) -> Response:
    """The coordinators' hanging-transaction detector compares these with their own state.

    Only partitions led here: a follower's producer state trails the leader's, and a
    marker (the only cure of a hanging transaction) is written by the leader alone. The
    age is from the node's clock, so clocks of different hosts never meet in it.
    """
    now = now_ms()
    rows = []
    for (topic, index), target in sorted(node.registry.partitions.items()):
        if not target.role.leads:
            continue
        for entry in list(target.engine.producers.producers.values()):
            first = entry.current_txn_first_offset
            if first is None:
                continue
            started = entry.current_txn_start_ms
            rows.append({
                "topic": topic, "partition": index, "producer_id": entry.producer_id,
                "producer_epoch": entry.epoch, "coordinator_epoch": entry.coordinator_epoch,
                "first_offset": first,
                "age_ms": 0 if started is None else max(0, now - started),
            })  # fmt: skip
    return json_response(
        {"node_id": node.settings.node_id, "now_ms": now, "open_transactions": rows}
    )
