"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from eos_protocol.common import Health
from eos_protocol.errors import KafkaStorageError
from eos_server.envelope import error_responses
from partition_service.context import Node

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    operation_id="health",
    summary="The process is up",
    response_model=Health,
    responses=error_responses(validated=False),
)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get(
    "/readyz",
    operation_id="ready",
    summary="Every partition recovered, none with failed storage",
    response_model=Health,
    responses=error_responses("KAFKA_STORAGE_ERROR"),
)
async def readyz(node: Node) -> Health:
    """Ready once every partition is recovered and none has failed storage."""
    failed = [
        f"{topic}-{index}"
        for (topic, index), partition in node.registry.partitions.items()
        if partition.committer.failed is not None
    ]
    if not node.ready or failed:
        raise KafkaStorageError(
            "not ready" if not failed else f"storage failed for {', '.join(failed)}"
        )
    return Health(status="ready")


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics (text format)",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **error_responses(validated=False),
    },
)
async def metrics(node: Node) -> Response:
    """Prometheus text format."""
    return Response(node.metrics.render(), media_type="text/plain; version=0.0.4")
