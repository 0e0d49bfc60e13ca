"""``create_app(settings)``: the storage node's FastAPI application.

The lifespan owns the partitions (recovered before the first request is served), the
verifier's HTTP client and the group-commit loops, and stops them in reverse order: the
last thing a clean shutdown does is flush and checkpoint every partition.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from partition_service.api import groups, health, internal, records
from partition_service.context import NodeContext
from partition_service.log.log import LogConfig
from partition_service.metrics import NodeMetrics
from partition_service.partition import Limits
from partition_service.registry import PartitionRegistry
from partition_service.settings import NodeSettings
from partition_service.verification import (
    CoordinatorVerifier,
    TransactionVerifier,
    TrustingVerifier,
)
from sdk.protocol.server import BodyLimit, install_error_handlers, internal_token_checker

log = logging.getLogger("eos.node")


def build_verifier(settings: NodeSettings) -> TransactionVerifier:
    if settings.txn_verification == "off":
        return TrustingVerifier()
    return CoordinatorVerifier(settings.coordinator_url, settings.internal_token)


def create_app(settings: NodeSettings | None = None) -> FastAPI:
    settings = settings or NodeSettings()
    registry = PartitionRegistry(
        settings.data_dir,
        log_config=LogConfig(
            segment_bytes=settings.segment_bytes,
            index_interval_bytes=settings.index_interval_bytes,
            producer_expiration_ms=settings.producer_expiration_ms,
        ),
        fsync=settings.fsync,
        checkpoint_interval_ms=settings.checkpoint_interval_ms,
        limits=Limits(max_record_bytes=settings.max_record_bytes),
        group_offset_partitions=settings.group_offset_partitions,
    )
    context = NodeContext(
        settings=settings,
        registry=registry,
        verifier=build_verifier(settings),
        metrics=NodeMetrics(registry),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        count = registry.load_all()
        registry.start()
        context.ready = True
        log.info("node %d ready with %d partitions", settings.node_id, count)
        try:
            yield
        finally:
            context.ready = False
            await registry.stop()
            await context.verifier.close()

    app = FastAPI(
        title="EOS storage node",
        version="1.0.0",
        description="Partition logs with idempotent and transactional writes.",
        lifespan=lifespan,
    )
    app.state.node = context
    app.state.internal_check = internal_token_checker(settings.internal_token)
    install_error_handlers(app, lambda code: context.metrics.errors.labels(code).inc())
    for router in (records.router, groups.router, internal.router, health.router):
        app.include_router(router)
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    return app
