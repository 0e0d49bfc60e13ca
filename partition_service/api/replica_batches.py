"""Replication endpoints that serve many partitions in one request: a follower's
fetch-many and epoch-ends (``docs/design.md`` section 7).

Kafka's followers send one Fetch to each leader broker for every partition they copy from
it, and so do EOS's: a follower of thousands of partitions keeps one long poll per leader
node open, not one per partition, so an idle cluster costs next to nothing and a busy one
answers many partitions per round trip. Each partition is checked and answered on its own
(an error of one is that entry's, never the request's), by the same rules as the
one-partition endpoints, which stay served for nodes of older releases.

The answer is answered at once when any partition has frames, must start again at the
leader's log start, or has an error; otherwise it waits, as the one-partition fetch does,
until one of them changes or ``max_wait_ms`` passes. While it waits, the follower counts
as caught up on each of the partitions (``LeaderReplicas.on_wait``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson
from fastapi import APIRouter, Depends
from fastapi.responses import Response

from eos_protocol.errors import EosError, InvalidRequestError, NotLeaderOrFollowerError
from eos_protocol.replica import (
    REPLICA_BATCH_MEDIA_TYPE,
    EpochEndsAnswer,
    EpochEndsRequest,
    ReplicaFetchManyRequest,
    ReplicaFetchPartition,
)
from eos_server.envelope import error_responses
from partition_service.api.internal import require_internal_token
from partition_service.api.records import json_response
from partition_service.context import Node, NodeContext
from partition_service.partition import Partition
from partition_service.replication.isr import LeaderReplicas

router = APIRouter(
    prefix="/internal/v1", tags=["internal"], dependencies=[Depends(require_internal_token)]
)


@dataclass
class _Served:
    """One partition of a fetch-many that this node leads, as it was when asked."""

    asked: ReplicaFetchPartition
    target: Partition
    leader: LeaderReplicas

    @property
    def has_news(self) -> bool:
        """Something to answer now: frames, a log start past the follower's end, or a
        change of leadership."""
        engine = self.target.engine
        return (
            self.target.role.leader is not self.leader
            or self.asked.fetch_offset < engine.log_start_offset
            or self.asked.fetch_offset < engine.log_end_offset
        )


def _error(asked: ReplicaFetchPartition, exc: EosError) -> dict[str, object]:
    return {"topic": asked.topic, "partition": asked.partition,
            "error": {"code": exc.code, "message": exc.message}}  # fmt: skip


def _serve(node: NodeContext, replica_id: int, asked: ReplicaFetchPartition) -> _Served:
    """The checks of the one-partition fetch, and the fetch offset taken as the
    follower's log end."""
    target = node.registry.get(asked.topic, asked.partition)
    leader = target.role.leader
    if leader is None:
        raise NotLeaderOrFollowerError(f"node {node.settings.node_id} does not lead "
                                       f"{asked.topic}-{asked.partition}")  # fmt: skip
    target.role.check_epoch(asked.leader_epoch)
    if replica_id not in leader.followers:
        raise InvalidRequestError(f"node {replica_id} is not a follower of this partition")
    target.on_replica_fetch(replica_id, asked.fetch_offset)
    return _Served(asked, target, leader)


async def _wait_for_news(served: list[_Served], replica_id: int, max_wait_ms: int) -> None:
    """Park until one partition has news or the wait is over: one event, set by every
    partition's change (``Partition.watchers``), looked at again after each."""
    deadline = time.monotonic() + max_wait_ms / 1000
    event = asyncio.Event()
    for entry in served:
        entry.target.watchers.add(event)
        entry.leader.on_wait(replica_id, True, entry.target.clock())
    try:
        while not any(entry.has_news for entry in served):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=left)
            except TimeoutError:
                return
    finally:
        for entry in served:
            entry.target.watchers.discard(event)
            entry.leader.on_wait(replica_id, False, entry.target.clock())


@router.post(
    "/replicas/fetch-many",
    operation_id="replicaFetchMany",
    summary="A follower copies frames of many partitions from one leader node",
    response_class=Response,
    responses={
        200: {
            "description": "One line of JSON (`ReplicaFetchManyHeader`: each partition's "
            "offsets, frame length or error), a newline, then the frames of each partition "
            "in that order, byte for byte.",
            "content": {REPLICA_BATCH_MEDIA_TYPE: {"schema": {"type": "string",
                                                              "format": "binary"}}},
        },
        **error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
    },
)
async def replica_fetch_many(body: ReplicaFetchManyRequest, node: Node) -> Response:
    served: list[_Served | dict[str, object]] = []
    for asked in body.partitions:
        try:
            served.append(_serve(node, body.replica_id, asked))
        except EosError as exc:
            served.append(_error(asked, exc))
    ok = [entry for entry in served if isinstance(entry, _Served)]
    if ok and len(ok) == len(served) and body.max_wait_ms > 0:
        await _wait_for_news(ok, body.replica_id, body.max_wait_ms)
    entries: list[dict[str, object]] = []
    chunks: list[bytes] = []
    budget = body.max_bytes
    for entry in served:
        if not isinstance(entry, _Served):
            entries.append(entry)
            continue
        try:
            frames = _frames(entry, budget if chunks else body.max_bytes)
        except EosError as exc:
            entries.append(_error(entry.asked, exc))
            continue
        engine = entry.target.engine
        entries.append({
            "topic": entry.asked.topic, "partition": entry.asked.partition,
            "high_watermark": engine.high_watermark, "log_start_offset": engine.log_start_offset,
            "leader_epoch": entry.leader.leader_epoch, "bytes": len(frames),
        })  # fmt: skip
        if frames:
            chunks.append(frames)
            budget -= len(frames)
    header = orjson.dumps({"partitions": entries})
    return Response(content=b"".join([header, b"\n", *chunks]),
                    media_type=REPLICA_BATCH_MEDIA_TYPE)  # fmt: skip


def _frames(entry: _Served, budget: int) -> bytes:
    """This partition's frames within what is left of the answer's bytes (nothing once
    it is spent: the follower asks again), refused if leadership moved meanwhile."""
    if entry.target.role.leader is not entry.leader:
        raise NotLeaderOrFollowerError("this node stopped leading the partition")
    engine = entry.target.engine
    if entry.asked.fetch_offset < engine.log_start_offset or budget <= 0:
        return b""
    return engine.read_frames(entry.asked.fetch_offset, min(entry.asked.max_bytes, budget))


@router.post(
    "/replicas/epoch-ends",
    operation_id="epochEnds",
    summary="Where epochs ended in the leader's logs, for many partitions "
    "(OffsetsForLeaderEpoch)",
    response_model=EpochEndsAnswer,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def epoch_ends(body: EpochEndsRequest, node: Node) -> Response:
    entries: list[dict[str, object]] = []
    for asked in body.partitions:
        try:
            target = node.registry.get(asked.topic, asked.partition)
            if target.role.leader is None:
                raise NotLeaderOrFollowerError(f"node {node.settings.node_id} does not lead "
                                               f"{asked.topic}-{asked.partition}")  # fmt: skip
            target.role.check_epoch(asked.leader_epoch)
            found, end = target.engine.end_offset_for(asked.epoch)
        except EosError as exc:
            entries.append({"topic": asked.topic, "partition": asked.partition,
                            "error": {"code": exc.code, "message": exc.message}})  # fmt: skip
            continue
        entries.append({"topic": asked.topic, "partition": asked.partition, "epoch": found,
                        "end_offset": end})  # fmt: skip
    return json_response({"partitions": entries})
