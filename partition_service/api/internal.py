"""Endpoints for coordinators only: transaction markers, partition creation and the
open transactions the hanging-transaction detector compares with its own state.

Every route here requires the cluster's internal token (checked in constant time); a
request without it is refused before anything is read or written.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response

from eos_protocol.common import topic_name_problem
from eos_protocol.errors import EosError, InvalidRequestError
from eos_protocol.hanging import OpenTransactionsResponse
from eos_protocol.node import (
    CreatePartitionRequest,
    CreatePartitionResponse,
    ListPartitionsResponse,
    MarkerPartitionResult,
    WriteMarkersRequest,
    WriteMarkersResponse,
)
from eos_server.envelope import error_responses
from eos_server.fastpath import FastCall, fast_path
from eos_server.logs import txn_fields
from partition_service.api.records import PartitionPath, TopicPath, json_response
from partition_service.context import Node, NodeContext
from partition_service.partition import now_ms

log = logging.getLogger("eos.node.markers")


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
