"""Endpoints of replication, for the cluster's services only (internal token): followers
fetch from their leader and ask it where an epoch ended; the controller pushes a
partition's new assignment (``docs/design.md`` section 7).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from eos_protocol.common import MAX_EPOCH
from eos_protocol.errors import InvalidRequestError, NotLeaderOrFollowerError
from eos_protocol.replica import (
    FRAMES_MEDIA_TYPE,
    HIGH_WATERMARK_HEADER,
    LEADER_EPOCH_HEADER,
    LOG_START_OFFSET_HEADER,
    EpochEndAnswer,
    ReplicaFetchRequest,
)
from eos_protocol.replication import PartitionStatePush, PushAnswer
from eos_server.envelope import error_responses
from partition_service.api.internal import require_internal_token
from partition_service.api.records import PartitionPath, TopicPath, json_response
from partition_service.context import Node
from partition_service.replication.role import Assignment

router = APIRouter(
    prefix="/internal/v1", tags=["internal"], dependencies=[Depends(require_internal_token)]
)
_ERRORS = ("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "UNKNOWN_TOPIC_OR_PARTITION",
           "NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH")  # fmt: skip


@router.post(
    "/replicas/fetch",
    operation_id="replicaFetch",
    summary="A follower copies frames from its leader",
    response_class=Response,
    responses={
        200: {
            "description": "The leader's frames from the fetch offset, byte for byte; its "
            "offsets in the x-eos-* headers.",
            "content": {FRAMES_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(*_ERRORS, "OFFSET_OUT_OF_RANGE"),
    },
)
async def replica_fetch(body: ReplicaFetchRequest, node: Node) -> Response:
    """Frames from the follower's log end, at once when there are some, else as soon as
    some arrive or after ``max_wait_ms``. The fetch offset is the follower's log end: the
    leader counts it toward the high watermark before it answers."""
    target = node.registry.get(body.topic, body.partition)
    role = target.role
    # the role changes in place when this node steps down during the wait: what it led
    # with is kept here, so that a change is seen and answered, never dereferenced
    leader = role.leader
    if leader is None:
        raise NotLeaderOrFollowerError(f"node {node.settings.node_id} does not lead "
                                       f"{body.topic}-{body.partition}")  # fmt: skip
    role.check_epoch(body.leader_epoch)
    if body.replica_id not in leader.followers:
        raise InvalidRequestError(f"node {body.replica_id} is not a follower of this partition")
    target.on_replica_fetch(body.replica_id, body.fetch_offset)
    engine = target.engine
    deadline = time.monotonic() + body.max_wait_ms / 1000
    if body.fetch_offset < engine.log_start_offset:
        # retention deleted what the follower lacks: no frames, and the log start in the
        # headers tells it to begin again there (``FollowerFetcher``)
        deadline = 0.0
    if body.fetch_offset >= engine.log_end_offset and deadline > time.monotonic():
        # parked at the log end: caught up while it waits, however long the poll
        leader.on_wait(body.replica_id, True, target.clock())
        try:
            while (
                target.role.leader is leader
                and body.fetch_offset >= engine.log_end_offset
                and (left := deadline - time.monotonic()) > 0
            ):
                if not await target.changed_within(left):
                    break
        finally:
            leader.on_wait(body.replica_id, False, target.clock())
    if target.role.leader is not leader:
        raise NotLeaderOrFollowerError("this node stopped leading the partition")
    data = (
        b""
        if body.fetch_offset < engine.log_start_offset
        else engine.read_frames(body.fetch_offset, body.max_bytes)
    )
    return Response(
        content=data,
        media_type=FRAMES_MEDIA_TYPE,
        headers={
            HIGH_WATERMARK_HEADER: str(engine.high_watermark),
            LOG_START_OFFSET_HEADER: str(engine.log_start_offset),
            LEADER_EPOCH_HEADER: str(leader.leader_epoch),
        },
    )


@router.get(
    "/replicas/{topic}/{partition}/epoch-end",
    operation_id="epochEnd",
    summary="Where an epoch ended in the leader's log (OffsetsForLeaderEpoch)",
    response_model=EpochEndAnswer,
    responses=error_responses(*_ERRORS),
)
async def epoch_end(
    topic: TopicPath,
    partition: PartitionPath,
    node: Node,
    epoch: Annotated[
        int, Query(ge=-1, le=MAX_EPOCH, description="The follower's latest epoch.")
    ],
    leader_epoch: Annotated[
        int, Query(ge=0, le=MAX_EPOCH, description="The epoch the follower follows.")
    ],
) -> Response:
    target = node.registry.get(topic, partition)
    if target.role.leader is None:
        raise NotLeaderOrFollowerError(f"node {node.settings.node_id} does not lead "
                                       f"{topic}-{partition}")  # fmt: skip
    target.role.check_epoch(leader_epoch)
    found, end = target.engine.end_offset_for(epoch)
    return json_response({"epoch": found, "end_offset": end})


@router.put(
    "/partitions/{topic}/{partition}/state",
    operation_id="pushPartitionState",
    summary="The controller's new assignment of a partition (LeaderAndIsr)",
    response_model=PushAnswer,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED",
                              "UNKNOWN_TOPIC_OR_PARTITION"),
)
async def push_partition_state(
    topic: TopicPath, partition: PartitionPath, body: PartitionStatePush, node: Node
) -> Response:
    replicas = node.replicas
    replicas.nodes.update(body.nodes)
    assignment = Assignment.of(body)
    await replicas.recreate_if_lost(topic, partition, assignment)
    node.registry.get(topic, partition)  # still unknown here: UNKNOWN_TOPIC_OR_PARTITION
    applied = replicas.apply(topic, partition, assignment)
    return json_response({"applied": applied})
