"""A coordinator that stops waits for the transactions still running on its worker
threads before it closes its database's connections, and refuses new ones.

A background task cancelled at the stop does not stop the worker thread its transaction
runs on. The pool was disposed under it; the connection, checked out meanwhile, went back
to the discarded pool and was collected later, still open, in whichever test ran next on
that process: a ``ResourceWarning`` from psycopg failed an unrelated test's setup
(``test_health_metrics_and_openapi``) in a fresh-clone run. SQLite stands in for
PostgreSQL here: the pool's count of checked-out connections is what tells."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.db.engine import UNAVAILABLE, Database, DatabaseClosedError, make_engine


def _held_open(db: Database, results: list[int]) -> tuple[threading.Event, threading.Thread]:
    """A transaction running on a thread of its own, held inside until the returned event
    is set; its result goes to ``results``."""
    inside, release = threading.Event(), threading.Event()

    def held(conn: Connection) -> int:
        inside.set()
        assert release.wait(30)
        return int(conn.exec_driver_sql("SELECT 1").scalar_one())

    worker = threading.Thread(target=lambda: results.append(db.transaction(held)))
    worker.start()
    assert inside.wait(30), "the transaction never began"
    return release, worker


def test_dispose_waits_for_a_running_transaction_then_refuses_new_ones(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db = Database(engine, threads=2)
    results: list[int] = []
    release, worker = _held_open(db, results)
    disposed = threading.Event()

    def stop() -> None:
        db.dispose()
        disposed.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    assert not disposed.wait(0.2), "dispose returned while a transaction was running"
    release.set()
    worker.join(30)
    stopper.join(30)
    assert disposed.is_set() and results == [1]
    pool = engine.pool
    assert isinstance(pool, sa.pool.QueuePool) and pool.checkedout() == 0
    with pytest.raises(DatabaseClosedError):
        db.transaction(lambda conn: 1)
    assert DatabaseClosedError in UNAVAILABLE  # answered 503, retriable, not 500


def test_dispose_gives_up_waiting_after_its_limit(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db = Database(engine, threads=1)
    release, worker = _held_open(db, [])
    began = time.monotonic()
    db.dispose(wait_s=0.3)
    assert 0.25 <= time.monotonic() - began < 10
    release.set()
    worker.join(30)
