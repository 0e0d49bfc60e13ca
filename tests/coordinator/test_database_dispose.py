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


def test_dispose_waits_for_a_running_transaction_then_refuses_new_ones(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db = Database(engine, threads=2)
    inside, release = threading.Event(), threading.Event()

    def slow(conn: Connection) -> int:
        inside.set()
        assert release.wait(30)
        return int(conn.exec_driver_sql("SELECT 1").scalar_one())

    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(db.transaction(slow)))
    worker.start()
    assert inside.wait(30), "the transaction never began"
    disposed = threading.Event()
    stopper = threading.Thread(target=lambda: (db.dispose(), disposed.set()))
    stopper.start()
    assert not disposed.wait(0.2), "dispose returned while a transaction was running"
    release.set()
    worker.join(30)
    stopper.join(30)
    assert disposed.is_set() and results == [1]
    pool = engine.pool
    assert isinstance(pool, sa.pool.QueuePool) and pool.checkedout() == 0
    with pytest.raises(DatabaseClosedError):
        db.transaction(slow)
    assert DatabaseClosedError in UNAVAILABLE  # answered 503, retriable, not 500


def test_dispose_gives_up_waiting_after_its_limit(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db = Database(engine, threads=1)
    inside, release = threading.Event(), threading.Event()

    def stuck(conn: Connection) -> None:
        inside.set()
        release.wait(30)

    worker = threading.Thread(target=db.transaction, args=(stuck,))
    worker.start()
    assert inside.wait(30)
    began = time.monotonic()
    db.dispose(wait_s=0.3)
    assert 0.25 <= time.monotonic() - began < 10
    release.set()
    worker.join(30)
