"""Coordinators sharing PostgreSQL keep their leases, instance heartbeats and transaction
deadlines on the database's clock: an instance whose wall clock runs minutes ahead or
behind reads the same time as the others (``coordinator_service.clock.DatabaseClock``).

Without it, an instance five minutes ahead saw every other instance's lease as run out and
took them all, and once restarted on the true time its own leases were held for five
minutes by nobody."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from coordinator_service.clock import DatabaseClock
from tests.support.coordinators import temp_database

SKEW_NS = 300 * 1_000_000_000  # five minutes


def _server_ms(conn: sa.Connection) -> int:
    query = sa.text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
    return int(conn.execute(query).scalar_one())


@pytest.mark.parametrize("skew_ns", [SKEW_NS, -SKEW_NS], ids=["ahead", "behind"])
def test_a_skewed_wall_clock_reads_the_database_time(
    skew_ns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    true_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: true_ns() + skew_ns)
    clock = DatabaseClock()
    with temp_database() as url:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                assert abs(clock.now_ms() - _server_ms(conn)) > 250_000  # before any reading
                clock.sync(conn)
                time.sleep(0.3)
                drift = clock.now_ms() - _server_ms(conn)
        finally:
            engine.dispose()
    # after the reading: the server's time, carried forward by the monotonic clock
    assert abs(drift) < 200, f"{drift} ms from the database's clock"
