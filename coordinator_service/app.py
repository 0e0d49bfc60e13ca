"""``create_app(settings)``: the coordinator's FastAPI application.

The lifespan owns everything with a life of its own and stops it in reverse order: the
database engine (migrated with Alembic first, unless told not to), the HTTP client for the
storage nodes, the marker channel, the leases and the background loops (lease renewal,
expiry scan, partition reconciler, metadata refresh, the controller, group sessions and
group lag). Clocks and the node transport are parameters, so tests drive time by hand and
can stand in for storage nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from coordinator_service import console
from coordinator_service.acls import AclRules
from coordinator_service.api import (
    acls,
    admin,
    hanging,
    health,
    internal,
    metadata,
    replication,
    transactions,
)
from coordinator_service.api import groups as groups_api
from coordinator_service.clock import Clock, DatabaseClock, SystemClock
from coordinator_service.cluster.instances import InstanceRegistry
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.cluster.node_link import node_link
from coordinator_service.controller.controller import Controller, ensure_controller_row
from coordinator_service.controller.metadata import Metadata, bootstrap
from coordinator_service.controller.partition_state import StoredPartition
from coordinator_service.controller.replication import Replication
from coordinator_service.controller.state_push import StatePusher
from coordinator_service.controller.topic_config import TopicRetention
from coordinator_service.db.engine import (
    UNAVAILABLE,
    Database,
    is_sqlite,
    make_engine,
    upgrade,
)
from coordinator_service.groups.coordinator import GroupCoordinator
from coordinator_service.groups.fencing import GroupFence
from coordinator_service.groups.lag_sampler import LagSampler
from coordinator_service.groups.offsets import GroupOffsets
from coordinator_service.hanging.detector import HangingDetector
from coordinator_service.hanging.nodes import NodeCalls
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.services import Services
from coordinator_service.settings import CoordinatorSettings
from coordinator_service.transactions.batcher import WriteBatcher
from coordinator_service.transactions.expiry import ExpiryScanner
from coordinator_service.transactions.lifecycle import TransactionCoordinator
from coordinator_service.transactions.markers import MarkerChannel
from coordinator_service.transactions.producer_ids import ProducerIdManager
from coordinator_service.transactions.store import TransactionStore
from eos_protocol.errors import CoordinatorNotAvailableError
from eos_protocol.versions import RELEASE
from eos_security import access as access_control
from eos_security.access import AccessControl
from eos_security.authorizer import Authorizer
from eos_server import fastpath
from eos_server.envelope import error_response, install_error_handlers
from eos_server.middleware import NATIVE_TELEMETRY_OFF, RequestShape
from eos_server.openapi import Server, install_document

log = logging.getLogger("eos.coordinator")

_DEFAULTS = CoordinatorSettings.model_fields
#: Where a coordinator listens unless told otherwise; ``eos up`` starts its first one there.
SERVERS: list[Server] = [
    {
        "url": f"http://{_DEFAULTS['host'].default}:{_DEFAULTS['port'].default}",
        "description": "A coordinator on its default address (the first of `eos up`).",
    }
]


async def _stop_step(what: str, step: Callable[[], Awaitable[object]]) -> None:
    """One step of a clean stop; a failure is logged and the stop goes on."""
    try:
        await step()
    except (Exception, asyncio.CancelledError):
        log.exception("stopping: %s failed; going on with the rest", what)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A request that needed the database while it could not be reached: retriable (a
    restart of PostgreSQL, a failover of its host), so the client tries again."""
    log.warning("%s %s: the database is unavailable: %s", request.method, request.url.path,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)  # fmt: skip
    return error_response(
        CoordinatorNotAvailableError("the coordinator's database cannot be reached now")
    )


def create_app(
    settings: CoordinatorSettings,
    *,
    clock: Clock | None = None,
    lease_clock: Clock | None = None,
    node_transport: httpx.AsyncBaseTransport | None = None,
    background: bool = True,
) -> FastAPI:
    """Build the app. ``background=False`` leaves the periodic loops off (tests call
    ``services.expiry.run_once()``, ``services.leases.run_round()`` and
    ``services.controller.run_once()`` themselves)."""
    shared_clock = None  # several instances on PostgreSQL: the database's clock (clock.py)
    if clock is None and lease_clock is None and not is_sqlite(settings.effective_database_url):
        shared_clock = DatabaseClock()
    txn_clock = clock or shared_clock or SystemClock()
    leases_clock = lease_clock or shared_clock or SystemClock()
    access = AccessControl(settings.token_registry(), Authorizer(settings.super_user_list))
    access_control.ensure_internal_token_distinct(access.tokens, settings.internal_token)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(
            settings.effective_database_url, pool_size=settings.db_pool_size,
            idle_in_transaction_ms=max(500, settings.lease_ms // 2),
        )
        http: httpx.AsyncClient | None = None
        try:  # a start that fails leaves no connection behind (the pool's last one was
            # collected later, open, in whatever ran next: a ResourceWarning there)
            if settings.migrate_on_start:
                await anyio.to_thread.run_sync(upgrade, engine)
            db = Database(engine, threads=settings.db_pool_size)
            if shared_clock is not None:
                await db.run(shared_clock.sync, 5)
            nodes = settings.node_urls
            cluster_id, node_id = await db.run(
                bootstrap, sorted(nodes), settings.group_offset_partitions, settings.instance_id,
                settings.effective_public_url, txn_clock.now_ms(),
                settings.default_replication_factor,
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
                default_replication_factor=settings.default_replication_factor,
                refresh_interval_ms=settings.metadata_refresh_ms,
                default_retention=TopicRetention(
                    settings.default_retention_ms, settings.default_retention_bytes
                ),
            )
            md.cluster_id = cluster_id
            await md.refresh()
            store = TransactionStore(db.dialect)
            writer = WriteBatcher(
                db, store, leases_clock, concurrency=settings.state_write_batches
            )
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
                leader_of=md.cached_leader, on_stale_leader=md.request_refresh,
            )
            md.leader_listeners.append(markers.leaders_changed)
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
                on_handoff=coordinator.hand_off, metrics=metrics,
            )
            coordinator.leases = leases
            groups = GroupCoordinator(
                db=db, metadata=md, clock=txn_clock, lease_clock=leases_clock,
                log_partitions=settings.txn_log_partitions,
                session_timeout_ms=settings.group_session_timeout_ms,
                heartbeat_interval_ms=settings.group_heartbeat_interval_ms,
                rebalance_timeout_ms=settings.group_rebalance_timeout_ms,
                max_size=settings.group_max_size,
            )
            groups.leases = leases
            coordinator.fence = GroupFence(db)
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
            await db.run(ensure_controller_row)
            pusher = StatePusher(http, nodes=nodes, internal_token=settings.internal_token)
            replicas = Replication(
                db, nodes=nodes, clock=leases_clock,
                session_timeout_ms=settings.node_session_timeout_ms, metrics=metrics,
                on_state=pusher.push,
            )

            async def new_states(states: list[StoredPartition]) -> None:
                replicas.forget_states()  # a new topic's: in heartbeat answers from now on
                await pusher.deliver(states)

            md.deliver_states = new_states

            def changed_state(state: StoredPartition) -> None:
                replicas.forget_states()  # heartbeat answers from now on carry the new state
                pusher.push(state)

            controller = Controller(
                db, instance_id=settings.instance_id, url=settings.effective_public_url,
                node_id=node_id, clock=leases_clock, lease_ms=settings.lease_ms,
                session_timeout_ms=settings.node_session_timeout_ms,
                interval_ms=settings.controller_interval_ms,
                rebalance_interval_ms=settings.leader_rebalance_interval_ms, metrics=metrics,
                on_change=md.request_refresh, on_state=changed_state, heard=replicas.heard,
            )
            detector = HangingDetector(
                db=db, coordinator=coordinator, metadata=md, controller=controller,
                calls=NodeCalls(http, nodes, settings.internal_token), clock=txn_clock,
                metrics=metrics, max_timeout_ms=settings.max_transaction_timeout_ms,
                margin_ms=settings.hanging_margin_ms,
                abort_after_ms=settings.abort_hanging_after_ms,
                interval_ms=settings.hanging_scan_interval_ms,
            )
            group_offsets = GroupOffsets(http, md)
            group_lag = LagSampler(groups, group_offsets, metrics,
                                   interval_ms=settings.group_lag_interval_ms)
            app.state.services = Services(
                settings=settings, clock=txn_clock, lease_clock=leases_clock, db=db, store=store,
                http=http, metadata=md, producer_ids=pids, markers=markers,
                coordinator=coordinator, leases=leases, expiry=expiry, metrics=metrics,
                node_id=node_id, writer=writer, access=access, acl_rules=acl_rules,
                instances=instances, controller=controller, replication=replicas,
                hanging=detector, groups=groups, group_offsets=group_offsets,
                group_lag=group_lag,
            )
        except BaseException:
            if http is not None:
                with contextlib.suppress(Exception):
                    await http.aclose()
            engine.dispose()
            raise
        writer.start()
        markers.start(coordinator.complete_jobs)
        tasks: list[asyncio.Task[None]] = []
        try:
            await leases.start()
            tasks.append(asyncio.create_task(md.run_reconciler(), name="reconciler"))
            tasks.append(asyncio.create_task(md.deleter.run_forever(), name="topic-deletion"))
            tasks.append(asyncio.create_task(acl_rules.run_forever(), name="acls"))
            tasks.append(asyncio.create_task(instances.run_forever(), name="heartbeat"))
            tasks.append(asyncio.create_task(md.run_refresher(), name="metadata"))
            if background:
                tasks.append(asyncio.create_task(controller.run_forever(), name="controller"))
                tasks.append(asyncio.create_task(leases.run_forever(), name="leases"))
                tasks.append(asyncio.create_task(expiry.run_forever(), name="expiry"))
                tasks.append(asyncio.create_task(detector.run_forever(), name="hanging"))
                tasks.append(asyncio.create_task(groups.run_forever(), name="groups"))
                if access.enabled:  # no token to ask the nodes with (lag_sampler.py)
                    log.info("group lag is not sampled for /metrics: token authentication "
                             "is on; GET /v1/groups/{id} reads it with the caller's token")
                else:
                    tasks.append(asyncio.create_task(group_lag.run_forever(), name="group-lag"))
            log.info(
                "coordinator %s (node id %d) ready at %s, owning %d log partitions",
                settings.instance_id, node_id, settings.effective_public_url,
                len(leases.owned),
            )
            yield
        finally:
            try:
                for task in reversed(tasks):
                    task.cancel()
                for task in reversed(tasks):
                    # a loop that died of an error has been logged; stop the rest anyway
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                # Each step on its own: one that fails (a marker task that died of an
                # error re-raises it when awaited) must not keep the leases from being
                # released, or the next owner waits out the lease time.
                for what, step in (
                    ("markers", markers.stop), ("state writer", writer.stop),
                    ("group writes", groups.stop),
                    ("leases", leases.release_all), ("controller lease", controller.release),
                    ("state pusher", pusher.stop), ("heartbeats", replicas.close),
                    ("instance record", instances.stop), ("node link", link.close),
                    ("http client", http.aclose),
                ):  # fmt: skip
                    await _stop_step(what, step)
            finally:
                db.dispose()  # whatever failed above: no connection outlives the app

    app = FastAPI(
        title="EOS transaction coordinator",
        version=RELEASE,  # the release (eos_protocol.versions), in info.version
        description="Kafka's transactional producer lifecycle over HTTP (docs/design.md §4).",
        lifespan=lifespan,
        telemetry=NATIVE_TELEMETRY_OFF,
    )
    install_document(app, SERVERS)
    install_error_handlers(app)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.include_router(health.router)
    app.include_router(metadata.router)
    app.include_router(admin.router)
    app.include_router(hanging.router)
    app.include_router(acls.router)
    app.include_router(transactions.router)
    app.include_router(groups_api.router)
    console.install(app)
    internal.install(app, settings.internal_token)
    replication.install(app, settings.internal_token)
    fastpath.install(app, [*transactions.FAST_PATHS, *internal.FAST_PATHS])
    access_control.install(app, access, settings.internal_token)
    app.add_middleware(RequestShape)  # outermost: malformed requests stop here
    return app
