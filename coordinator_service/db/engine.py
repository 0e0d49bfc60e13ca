"""Engine setup, migrations and the one place where database transactions begin and end.

``Database.run(fn, ...)`` is the transaction owner of the coordinator: it opens a
transaction, calls ``fn(conn, ...)`` (repositories only execute statements on that
connection, they never commit) and commits when ``fn`` returns. It runs on a worker thread
so the event loop keeps serving while PostgreSQL syncs its log.

SQLite is the single-instance default. It serialises writers with a file lock, so every
transaction there starts with ``BEGIN IMMEDIATE``: a deferred transaction that later tries
to write can deadlock against another one holding a read lock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

# Migrations live in ``migrate.py`` (how they run on SQLite with data, all or nothing);
# re-exported here, where the rest of the code has always found them.
from coordinator_service.db.migrate import MIGRATIONS_DIR as MIGRATIONS_DIR
from coordinator_service.db.migrate import MigrationError as MigrationError
from coordinator_service.db.migrate import alembic_config as alembic_config
from coordinator_service.db.migrate import upgrade as upgrade

P = ParamSpec("P")
T = TypeVar("T")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(
    url: str, *, pool_size: int = 16, idle_in_transaction_ms: int | None = None
) -> Engine:
    """An engine for ``url``, tuned for the coordinator's short write transactions.

    ``idle_in_transaction_ms`` (PostgreSQL): the server ends a session of this process
    that sits inside a transaction that long. A coordinator that is paused (SIGSTOP, a
    frozen VM) between two statements of a write keeps its connection and so its row
    locks; without this limit the instance taking over its leases would wait on those
    locks for as long as the pause lasts. The coordinator's transactions run their
    statements back to back, so the limit is set well below the lease time.
    """
    if is_sqlite(url):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            max_overflow=0,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    connect_args: dict[str, Any] = {}
    if idle_in_transaction_ms is not None:
        connect_args["options"] = f"-c idle_in_transaction_session_timeout={idle_in_transaction_ms}"
    return sa.create_engine(
        url, pool_size=pool_size, max_overflow=4, pool_recycle=1800,
        connect_args=connect_args,
    )


FIRST_START_LOCK = 4243


def serialize_first_start(conn: Connection) -> None:
    """Make check-then-insert start-up work safe when several coordinators start at once.

    On PostgreSQL a transaction-scoped advisory lock lets one instance create the shared
    rows (cluster id, ``__consumer_offsets``, lease rows) while the others wait and then
    see them; SQLite's single writer (``BEGIN IMMEDIATE``) already gives that order.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({FIRST_START_LOCK})")


class DatabaseClosedError(Exception):
    """A transaction asked for after ``Database.dispose``: the coordinator is stopping."""


#: What the driver raises when the database cannot be reached or gave up on a statement
#: (connection refused or lost, the server shutting down, a deadlock or serialisation
#: failure, a pool with no connection to give, a coordinator stopping): the request may be
#: tried again, so it is answered COORDINATOR_NOT_AVAILABLE (503, retriable), never
#: INTERNAL_ERROR.
UNAVAILABLE: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
    DatabaseClosedError,
)
#: How long ``Database.dispose`` waits for the transactions still running on its threads.
DISPOSE_WAIT_S = 10.0


class Database:
    """The engine plus a bounded pool of worker threads that run transactions on it.

    ``dispose`` waits for the transactions still running: a task cancelled at the stop
    does not stop its worker thread, whose connection, checked out while the pool was
    disposed, went back to the discarded pool and was collected later, open, in
    whatever ran next (a ``ResourceWarning`` there). A transaction asked for after it is
    refused (``DatabaseClosedError``, answered as the database being unavailable)."""

    def __init__(self, engine: Engine, *, threads: int) -> None:
        self.engine = engine
        self._limiter = anyio.CapacityLimiter(threads)
        self._state = threading.Condition()
        self._running = 0
        self._closed = False

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one database transaction, on the calling thread."""
        with self._state:
            if self._closed:
                raise DatabaseClosedError("the coordinator is stopping: its database is closed")
            self._running += 1
        try:
            with self.engine.begin() as conn:
                return fn(conn, *args)
        finally:
            with self._state:
                self._running -= 1
                self._state.notify_all()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one database transaction, on a worker thread."""
        call = functools.partial(self.transaction, fn, *args)
        return await anyio.to_thread.run_sync(call, limiter=self._limiter)

    def dispose(self, wait_s: float = DISPOSE_WAIT_S) -> None:
        """Refuse new transactions, wait up to ``wait_s`` for those running, then close
        the pool's connections."""
        with self._state:
            self._closed = True
            self._state.wait_for(lambda: self._running == 0, timeout=wait_s)
        self.engine.dispose()
