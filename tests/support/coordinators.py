"""Coordinators for tests: throw-away PostgreSQL databases, in-process apps on a real
uvicorn server, single coordinator processes, and fake storage nodes.

Each test that needs PostgreSQL gets its own database ``eos_test_<random>``, created on the
``postgres`` database and dropped afterwards; the coordinator migrates it with Alembic
when it starts, exactly as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import psycopg
import uvicorn

from coordinator_service.app import create_app
from coordinator_service.clock import Clock
from coordinator_service.services import Services
from coordinator_service.settings import CoordinatorSettings
from eos_cli.launcher import coordinator_args
from tests.support.processes import ServiceProcess, free_port, wait_until

T = TypeVar("T")

PG_HOST = os.environ.get("EOS_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("EOS_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("EOS_TEST_PG_USER", "postgres")
INTERNAL_TOKEN = "test-internal-token-0123456789abcdef"


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    )


def create_database() -> tuple[str, str]:
    """A new empty database; returns its name and its SQLAlchemy URL."""
    name = f"eos_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


def drop_database(name: str) -> None:
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def open_connections(name: str) -> int:
    """How many sessions are connected to database ``name`` now."""
    with _admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def temp_database() -> Iterator[str]:
    name, url = create_database()
    try:
        yield url
    finally:
        drop_database(name)


class InProcessCoordinator:
    """A coordinator app served by uvicorn on a thread of the test process, so a test can
    use real HTTP and still reach into its services (fake clocks, expiry scans)."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        *,
        clock: Clock | None = None,
        lease_clock: Clock | None = None,
        node_transport: httpx.AsyncBaseTransport | None = None,
        background: bool = True,
    ) -> None:
        self.settings = settings
        self.app = create_app(
            settings,
            clock=clock,
            lease_clock=lease_clock,
            node_transport=node_transport,
            background=background,
        )
        self.loop = asyncio.new_event_loop()
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            self.loop.close()

    def start(self, timeout: float = 30.0) -> InProcessCoordinator:
        self.thread.start()

        def started() -> bool:
            if not self.thread.is_alive():
                raise AssertionError("the coordinator failed to start (see the log)")
            return bool(self.server.started)

        wait_until(started, timeout=timeout, what="in-process coordinator")
        return self

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run ``await fn()`` on the server's event loop and return its result."""

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(timeout=30)


def coordinator_settings(
    database_url: str | None, nodes: str, **overrides: Any
) -> CoordinatorSettings:
    """Settings for a test coordinator on a free port."""
    port = overrides.pop("port", None) or free_port()
    values: dict[str, Any] = {
        "port": port,
        "database_url": database_url,
        "nodes": nodes,
        "internal_token": INTERNAL_TOKEN,
        "group_offset_partitions": 5,
        "log_level": "warning",
        "marker_backoff_max_ms": 200,
        "reconcile_interval_ms": 100,
    }
    values.update(overrides)
    return CoordinatorSettings(**values)


class CoordinatorProcess(ServiceProcess):
    """One ``python -m coordinator_service`` on ``database_url``, for the tests of a
    coordinator's own start (several at once on a fresh database, a restart with a fixed
    instance id); clusters come from ``tests.support.cluster``."""

    def __init__(
        self,
        log_dir: Path,
        *,
        database_url: str,
        nodes: str,
        name: str = "coordinator",
        port: int | None = None,
        extra: list[str] | None = None,
    ) -> None:
        port = port or free_port()
        args = coordinator_args(port, nodes, database_url=database_url)
        args += ["--instance-id", f"{name}-{port}", *(extra or [])]
        log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            name,
            [sys.executable, "-m", "coordinator_service", *args],
            port=port,
            log_path=log_dir / f"{name}-{port}.log",
            env={**os.environ, "EOS_INTERNAL_TOKEN": INTERNAL_TOKEN},
        )

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


class FakeNodes:
    """Storage nodes stood in by an ``httpx.MockTransport``: they accept partition creation
    and markers, remember what they got, can be taken down, and refuse a marker whose
    coordinator epoch is older than one already seen for that producer (as real nodes do)."""

    def __init__(self, node_ids: tuple[int, ...] = (1, 2)) -> None:
        self.urls = {n: f"http://node{n}.test" for n in node_ids}
        self.down: set[int] = set()
        self.markers: list[tuple[int, dict[str, Any]]] = []
        self.created: set[tuple[int, str, int]] = set()
        self._epochs: dict[tuple[int, str, int], int] = {}
        self._lock = threading.Lock()
        self.transport = httpx.MockTransport(self._handle)

    @property
    def spec(self) -> str:
        return ",".join(f"{n}={u}" for n, u in self.urls.items())

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        if node in self.down:
            raise httpx.ConnectError("node is down", request=request)
        if request.headers.get("authorization") != f"Bearer {INTERNAL_TOKEN}":
            return httpx.Response(
                401, json={"error": {"code": "UNAUTHENTICATED", "message": "", "retriable": False}}
            )
        path = request.url.path
        if request.method == "PUT" and path.startswith("/internal/v1/partitions/"):
            _, _, _, _, topic, partition = path.split("/")
            with self._lock:
                created = (node, topic, int(partition)) not in self.created
                self.created.add((node, topic, int(partition)))
            return httpx.Response(
                200, json={"topic": topic, "partition": int(partition), "created": created}
            )
        if request.method == "POST" and path == "/internal/v1/markers":
            body = orjson.loads(request.content)
            results = []
            with self._lock:
                for marker in body["markers"]:
                    self.markers.append((node, marker))
                    for tp in marker["partitions"]:
                        key = (marker["producer_id"], tp["topic"], tp["partition"])
                        error = None
                        if self._epochs.get(key, -1) > marker["coordinator_epoch"]:
                            error = "TRANSACTION_COORDINATOR_FENCED"
                        else:
                            self._epochs[key] = marker["coordinator_epoch"]
                        results.append(
                            {
                                "producer_id": marker["producer_id"],
                                "topic": tp["topic"],
                                "partition": tp["partition"],
                                "error": error,
                            }
                        )
            return httpx.Response(200, json={"results": results})
        return httpx.Response(
            404, json={"error": {"code": "NOT_FOUND", "message": path, "retriable": False}}
        )

    def markers_for(self, producer_id: int) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            return [(n, m) for n, m in self.markers if m["producer_id"] == producer_id]
