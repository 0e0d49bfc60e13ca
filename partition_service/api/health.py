"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from partition_service.context import Node
from sdk.protocol.common import Health
from sdk.protocol.errors import KafkaStorageError

router = APIRouter(tags=["operations"])


@router.get("/healthz", operation_id="health", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", operation_id="ready", response_model=Health)
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


@router.get("/metrics", operation_id="metrics", response_class=Response)
async def metrics(node: Node) -> Response:
    """Prometheus text format."""
    return Response(node.metrics.render(), media_type="text/plain; version=0.0.4")
