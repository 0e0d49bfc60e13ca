"""``/healthz`` (the process answers), ``/readyz`` (its leases are taken and loaded) and
``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from coordinator_service.api.deps import ServicesDep
from coordinator_service.groups.lag_sampler import coordinated_groups
from eos_protocol.common import Health
from eos_server.envelope import error_responses

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    operation_id="health",
    summary="The process answers",
    response_model=Health,
    responses=error_responses(validated=False),
)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    operation_id="ready",
    summary="Leases taken and loaded",
    response_model=Health,
    responses={
        **error_responses(validated=False),
        503: {"model": Health, "description": "Still loading its leases."},
    },
)
async def readyz(services: ServicesDep) -> Health | JSONResponse:
    """Ready once the first lease round has taken and loaded this instance's share, and
    from then on: a partition taken later (a rebalance, a dead peer's) loads while every
    other one is served, and requests for it get a retriable answer meanwhile. A probe
    that turned 503 at each such load would pull a serving instance out of rotation."""
    if not services.leases.ready:
        return JSONResponse(status_code=503, content={"status": "loading"})
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
async def metrics(services: ServicesDep) -> Response:
    services.metrics.refresh(
        open_transactions=services.coordinator.open_transactions(),
        queue_depth=services.markers.queue_depth(),
        oldest_ms=services.markers.oldest_age_ms(),
        owned=len(services.leases.owned),
    )
    services.metrics.refresh_groups(
        members=services.groups.member_count(),
        groups=len(coordinated_groups(services.groups)),
        rebalances=services.groups.rebalances,
    )
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)
