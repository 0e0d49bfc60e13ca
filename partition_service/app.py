"""``create_app(settings)``: the storage node's FastAPI application.

The lifespan owns the partitions (recovered before the first request is served), the
verifier's HTTP client and the group-commit loops, and stops them in reverse order: the
last thing a clean shutdown does is flush and checkpoint every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from eos_protocol.versions import RELEASE
from eos_security import access as access_control
from eos_security.access import AccessControl
from eos_security.authorizer import Authorizer
from eos_server import fastpath
from eos_server.envelope import install_error_handlers
from eos_server.internal import internal_token_checker
from eos_server.middleware import NATIVE_TELEMETRY_OFF, BodyLimit, RequestShape
from eos_server.openapi import Server, install_document
from partition_service.acls import AclFetcher
from partition_service.api import (
    describe_producers,
    fetch_many,
    groups,
    health,
    internal,
    listing,
    produce_many,
    records,
    replica_batches,
    replicas,
)
from partition_service.context import NodeContext
from partition_service.coordinators import CoordinatorPool
from partition_service.group_commit import Durability
from partition_service.log.log import LogConfig
from partition_service.metrics import NodeMetrics
from partition_service.partition import Limits
from partition_service.registry import PartitionRegistry
from partition_service.replication.manager import ReplicaManager
from partition_service.retention import RetentionLoop
from partition_service.settings import NodeSettings
from partition_service.verification import (
    CoordinatorVerifier,
    TransactionVerifier,
    TrustingVerifier,
)

log = logging.getLogger("eos.node")

_DEFAULTS = NodeSettings.model_fields
_HOST = _DEFAULTS["host"].default
#: Where a storage node listens unless told otherwise, and where ``eos up`` puts node 1
#: (node N on its port base + 10 + N: 8091, 8092, ... with the default base of 8080).
SERVERS: list[Server] = [
    {
        "url": f"http://{_HOST}:{_DEFAULTS['port'].default}",
        "description": "A storage node on its default address.",
    },
    {
        "url": f"http://{_HOST}:8091",
        "description": "Node 1 of `eos up`'s local cluster (node N listens on 8090 + N).",
    },
]


def build_verifier(settings: NodeSettings, pool: CoordinatorPool) -> TransactionVerifier:
    if settings.txn_verification == "off":
        return TrustingVerifier()
    return CoordinatorVerifier(pool)


def build_pool(settings: NodeSettings) -> CoordinatorPool:
    return CoordinatorPool(
        settings.coordinator_urls, settings.internal_token,
        timeout_s=settings.coordinator_timeout_ms / 1000, verify=settings.client_verify(),
    )


def create_app(settings: NodeSettings | None = None) -> FastAPI:
    settings = settings or NodeSettings()
    registry = PartitionRegistry(
        settings.data_dir,
        log_config=LogConfig(
            segment_bytes=settings.segment_bytes,
            index_interval_bytes=settings.index_interval_bytes,
            producer_expiration_ms=settings.producer_expiration_ms,
        ),
        durability=Durability(
            fsync=settings.fsync,
            checkpoint_interval_ms=settings.checkpoint_interval_ms,
            inline_fsync_under_us=settings.inline_fsync_under_us,
        ),
        limits=Limits(max_record_bytes=settings.max_record_bytes),
        group_offset_partitions=settings.group_offset_partitions,
        node_id=settings.node_id,
    )
    authorizer = Authorizer()
    pool = build_pool(settings)
    fetcher = AclFetcher(authorizer, pool, refresh_interval_ms=settings.acl_refresh_ms)
    access = AccessControl(settings.token_registry(), authorizer, refresh=fetcher.refresh)
    access_control.ensure_internal_token_distinct(access.tokens, settings.internal_token)
    # Follower fetches are long polls: their own client, not the coordinators' pool.
    replica_client = httpx.AsyncClient(timeout=15.0, verify=settings.client_verify())
    replica_manager = ReplicaManager(
        registry, node_id=settings.node_id, pool=pool, client=replica_client,
        internal_token=settings.internal_token,
        replica_lag_time_max_ms=settings.replica_lag_time_max_ms,
        replica_fetch_wait_max_ms=settings.replica_fetch_wait_max_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        controller_session_timeout_ms=settings.controller_session_timeout_ms,
    )  # fmt: skip
    metrics = NodeMetrics(registry)
    metrics.known_coordinators.set_function(lambda: len(pool.known))
    retention = RetentionLoop(
        registry, metrics, interval_ms=settings.retention_check_interval_ms
    )
    context = NodeContext(
        settings=settings,
        registry=registry,
        verifier=build_verifier(settings, pool),
        metrics=metrics,
        access=access,
        replicas=replica_manager,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        count = registry.load_all()
        registry.start()
        loops: list[asyncio.Task[None]] = [
            asyncio.create_task(retention.run_forever(), name="retention")
        ]
        if access.enabled:
            loops.append(asyncio.create_task(fetcher.run_forever(), name="acls"))
        if pool.configured and settings.learn_coordinators:
            interval_s = settings.acl_refresh_ms / 1000
            loops.append(asyncio.create_task(pool.run_forever(interval_s), name="members"))
        if pool.configured and settings.heartbeat_interval_ms > 0:
            loops.append(asyncio.create_task(replica_manager.run_heartbeats(), name="beats"))
            loops.append(asyncio.create_task(replica_manager.run_isr_checks(), name="isr"))
        context.ready = True
        log.info("node %d ready with %d partitions", settings.node_id, count)
        try:
            yield
        finally:
            context.ready = False
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await replica_manager.stop()
            await registry.stop()
            await replica_client.aclose()
            await context.verifier.close()
            await fetcher.close()
            await pool.close()

    app = FastAPI(
        title="EOS storage node",
        version=RELEASE,  # the release (eos_protocol.versions), in info.version
        description="Partition logs with idempotent and transactional writes.",
        lifespan=lifespan,
        telemetry=NATIVE_TELEMETRY_OFF,
    )
    install_document(app, SERVERS)
    app.state.node = context
    app.state.internal_check = internal_token_checker(settings.internal_token)
    install_error_handlers(app, lambda code: context.metrics.errors.labels(code).inc())
    for router in (
        records.router, produce_many.router, listing.router, groups.router, internal.router,
        replicas.router, replica_batches.router, health.router,
        fetch_many.router, describe_producers.router,
    ):
        app.include_router(router)
    # inside every middleware added below
    fastpath.install(app, [*records.FAST_PATHS, *produce_many.FAST_PATHS, *internal.FAST_PATHS])
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    access_control.install(app, access, settings.internal_token)
    app.add_middleware(RequestShape)  # outermost: malformed requests stop here
    return app
