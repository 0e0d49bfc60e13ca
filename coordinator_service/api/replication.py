"""Internal endpoints of replication, for storage nodes only (internal token required):
heartbeats and AlterPartition (docs/design.md §7). Any instance answers: the partition
state is in the database (``coordinator_service/controller/replication.py``)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Path
from fastapi.responses import Response

from coordinator_service.api.deps import ServicesDep
from eos_protocol.common import MAX_PARTITIONS_PER_TOPIC
from eos_protocol.errors import EosError
from eos_protocol.replication import (
    AlterIsrRequest,
    HeartbeatAnswer,
    IsrChangesAnswer,
    IsrChangesRequest,
    NodeHeartbeat,
    PartitionState,
)
from eos_server.envelope import error_responses
from eos_server.internal import internal_token_checker

NodeIdPath = Path(ge=0, le=2**31 - 1, description="The storage node's id.")


def build_router(internal_token: str | None) -> APIRouter:
    router = APIRouter(
        prefix="/internal/v1",
        tags=["internal"],
        dependencies=[Depends(internal_token_checker(internal_token))],
    )

    @router.post(
        "/nodes/{node_id}/heartbeat",
        operation_id="nodeHeartbeat",
        summary="A storage node is alive; answers its partitions' states (nodes only)",
        response_model=HeartbeatAnswer,
        responses=error_responses(
            "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "COORDINATOR_NOT_AVAILABLE"
        ),
    )
    async def heartbeat(
        body: NodeHeartbeat, services: ServicesDep, node_id: int = NodeIdPath
    ) -> HeartbeatAnswer:
        """Records the beat and answers every storage node and the state of every
        partition this node is a replica of (none while they are those it already
        has): the node learns its roles from it."""
        return await services.replication.heartbeat(
            node_id, body.url, body.incarnation, known_states=body.known_states
        )

    @router.post(
        "/partitions/{topic}/{partition}/isr",
        operation_id="alterPartition",
        summary="A leader's new ISR for its partition (AlterPartition; nodes only)",
        response_model=PartitionState,
        responses=error_responses(
            "INVALID_REQUEST", "FENCED_LEADER_EPOCH", "UNKNOWN_TOPIC_OR_PARTITION",
            "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED",
        ),
    )
    async def alter_partition(
        body: AlterIsrRequest,
        services: ServicesDep,
        topic: str = Path(min_length=1, max_length=249, description="The topic."),
        partition: int = Path(ge=0, lt=MAX_PARTITIONS_PER_TOPIC, description="The partition."),
    ) -> PartitionState:
        """Accepted only at the stored leader, leader epoch and partition epoch
        (``FENCED_LEADER_EPOCH`` otherwise, the stored state in its details); the ISR must
        include the leader and only replicas, and a replica joins only while alive."""
        return await services.replication.alter_isr(topic, partition, body)

    @router.post(
        "/isr-changes",
        operation_id="alterPartitions",
        summary="A leader's new ISRs for many partitions (AlterPartition; nodes only)",
        response_model=IsrChangesAnswer,
        responses=error_responses(
            "INVALID_REQUEST", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED",
            "COORDINATOR_NOT_AVAILABLE",
        ),
    )
    async def alter_partitions(body: IsrChangesRequest, services: ServicesDep) -> Response:
        """Each proposal decided as ``alterPartition`` decides it, its error its own (a
        ``FENCED_LEADER_EPOCH`` carries the stored state in its details); all in one
        database transaction."""
        outcomes = await services.replication.alter_isr_many(body.leader, body.partitions)
        entries: list[dict[str, Any]] = []
        for change, outcome in zip(body.partitions, outcomes, strict=True):
            entry: dict[str, Any] = {"topic": change.topic, "partition": change.partition,
                                     "state": None, "error": None}  # fmt: skip
            if isinstance(outcome, EosError):
                entry["error"] = outcome.envelope()["error"]
            else:
                entry["state"] = outcome.model_dump()
            entries.append(entry)
        return Response(orjson.dumps({"partitions": entries}), media_type="application/json")

    return router


def install(app: FastAPI, internal_token: str | None) -> None:
    app.include_router(build_router(internal_token))
