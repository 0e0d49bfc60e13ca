"""``create_app(settings)``: the coordinator's FastAPI application.

The lifespan owns everything with a life of its own and stops it in reverse order: the
database engine (migrated with Alembic first, unless told not to), the HTTP client for the
storage nodes, the marker channel, the leases and the background loops (lease renewal,
expiry scan, partition reconciler). Clocks and the node transport are parameters, so tests
drive time by hand and can stand in for storage nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
import httpx
from fastapi import FastAPI

from coordinator_service.acls import AclRules
from coordinator_service.api import (
    acls,
    admin,
    health,
    internal,
    metadata,
    transactions,
)
from coordinator_service.clock import Clock, SystemClock
from coordinator_service.db.engine import Database, make_engine, upgrade
from coordinator_service.expiry import ExpiryScanner
from coordinator_service.instances import InstanceRegistry
from coordinator_service.leases import LeaseManager
from coordinator_service.markers import MarkerChannel
from coordinator_service.metadata import Metadata, bootstrap
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.node_link import node_link
from coordinator_service.producer_ids import ProducerIdManager
from coordinator_service.services import Services
from coordinator_service.settings import CoordinatorSettings
from coordinator_service.transactions.batcher import WriteBatcher
from coordinator_service.transactions.lifecycle import TransactionCoordinator
from coordinator_service.transactions.store import TransactionStore
from eos_security import access as access_control
from eos_security.access import AccessControl
from eos_security.authorizer import Authorizer
from eos_server import fastpath
from eos_server.envelope import install_error_handlers
from eos_server.middleware import RequestShape

log = logging.getLogger("eos.coordinator")


def create_app(
    settings: CoordinatorSettings,
    *,
    clock: Clock | None = None,
    lease_clock: Clock | None = None,
    node_transport: httpx.AsyncBaseTransport | None = None,
    background: bool = True,
) -> FastAPI:
    """Build the app. ``background=False`` leaves the periodic loops off (tests call
    ``services.expiry.run_once()`` and ``services.leases.run_round()`` themselves)."""
    txn_clock = clock or SystemClock()
    leases_clock = lease_clock or SystemClock()
    access = AccessControl(settings.token_registry(), Authorizer(settings.super_user_list))
    access_control.ensure_internal_token_distinct(access.tokens, settings.internal_token)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(
            settings.effective_database_url, pool_size=settings.db_pool_size,
            idle_in_transaction_ms=max(500, settings.lease_ms // 2),
        )
        if settings.migrate_on_start:
            await anyio.to_thread.run_sync(upgrade, engine)
        db = Database(engine, threads=settings.db_pool_size)
        nodes = settings.node_urls
        cluster_id, node_id = await db.run(
            bootstrap, sorted(nodes), settings.group_offset_partitions, settings.instance_id,
            settings.effective_public_url, txn_clock.now_ms(),
        )
        http = httpx.AsyncClient(
            transport=node_transport,
            timeout=settings.node_timeout_ms / 1000,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            verify=settings.client_verify(),
        )
        metrics = CoordinatorMetrics()
        md = Metadata(
            db, nodes=nodes, client=http, internal_token=settings.internal_token,
            clock=txn_clock, reconcile_interval_ms=settings.reconcile_interval_ms,
            offsets_partitions=settings.group_offset_partitions, metrics=metrics,
        )
        md.cluster_id = cluster_id
        await md.refresh()
        store = TransactionStore(db.dialect)
        writer = WriteBatcher(db, store, leases_clock)
        pids = ProducerIdManager(
            db, owner=settings.instance_id, block_size=settings.producer_id_block_size,
            clock=txn_clock,
        )
        link = node_link(
            http, transport_injected=node_transport is not None,
            timeout_s=settings.node_timeout_ms / 1000,
        )
        markers = MarkerChannel(
            nodes=nodes, link=link, internal_token=settings.internal_token, clock=txn_clock,
            backoff_max_ms=settings.marker_backoff_max_ms,
            batch_partitions=settings.marker_batch_partitions, metrics=metrics,
        )
        coordinator = TransactionCoordinator(
            db=db, store=store, writer=writer, markers=markers, producer_ids=pids, metadata=md,
            metrics=metrics, clock=txn_clock, lease_clock=leases_clock,
            log_partitions=settings.txn_log_partitions,
            max_timeout_ms=settings.max_transaction_timeout_ms,
            init_wait_ms=settings.init_wait_ms,
        )
        leases = LeaseManager(
            db, instance_id=settings.instance_id, url=settings.effective_public_url,
            node_id=node_id, partitions=settings.txn_log_partitions,
            lease_ms=settings.lease_ms, renew_interval_ms=settings.lease_renew_interval_ms,
            clock=leases_clock, on_acquired=coordinator.load, on_lost=coordinator.unload,
            metrics=metrics,
        )
        coordinator.leases = leases
        expiry = ExpiryScanner(
            coordinator, clock=txn_clock, interval_ms=settings.expiry_scan_interval_ms,
            expiration_ms=settings.transactional_id_expiration_ms, metrics=metrics,
        )
        instances = InstanceRegistry(
            db, instance_pk=node_id, url=settings.effective_public_url, clock=leases_clock,
            lease_ms=settings.lease_ms, interval_ms=settings.lease_renew_interval_ms,
        )
        await instances.beat()
        acl_rules = AclRules(
            db, access.authorizer, refresh_interval_ms=settings.acl_refresh_ms, metrics=metrics
        )
        await acl_rules.reload()
        access.refresh = acl_rules.reload
        app.state.services = Services(
            settings=settings, clock=txn_clock, lease_clock=leases_clock, db=db, store=store,
            http=http, metadata=md, producer_ids=pids, markers=markers,
            coordinator=coordinator, leases=leases, expiry=expiry, metrics=metrics,
            node_id=node_id, writer=writer, access=access, acl_rules=acl_rules,
            instances=instances,
        )
        writer.start()
        markers.start(coordinator.complete_jobs)
        tasks: list[asyncio.Task[None]] = []
        try:
            await leases.start()
            tasks.append(asyncio.create_task(md.run_reconciler(), name="reconciler"))
            tasks.append(asyncio.create_task(acl_rules.run_forever(), name="acls"))
            tasks.append(asyncio.create_task(instances.run_forever(), name="heartbeat"))
            if background:
                tasks.append(asyncio.create_task(leases.run_forever(), name="leases"))
                tasks.append(asyncio.create_task(expiry.run_forever(), name="expiry"))
            log.info(
                "coordinator %s (node id %d) ready at %s, owning %d log partitions",
                settings.instance_id, node_id, settings.effective_public_url,
                len(leases.owned),
            )
            yield
        finally:
            for task in reversed(tasks):
                task.cancel()
            for task in reversed(tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await markers.stop()
            await writer.stop()
            with contextlib.suppress(Exception):
                await leases.release_all()
            with contextlib.suppress(Exception):
                await instances.stop()
            await link.close()
            await http.aclose()
            db.dispose()

    app = FastAPI(
        title="EOS transaction coordinator",
        version="0.1.0",
        description="Kafka's transactional producer lifecycle over HTTP (docs/design.md §4).",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(metadata.router)
    app.include_router(admin.router)
    app.include_router(acls.router)
    app.include_router(transactions.router)
    internal.install(app, settings.internal_token)
    fastpath.install(app, [*transactions.FAST_PATHS, *internal.FAST_PATHS])
    access_control.install(app, access, settings.internal_token)
    app.add_middleware(RequestShape)  # outermost: malformed requests stop here
    return app
