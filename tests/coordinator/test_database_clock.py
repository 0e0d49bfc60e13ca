"""Coordinators sharing PostgreSQL keep their leases, instance heartbeats and transaction
deadlines on the database's clock: an instance whose wall clock runs minutes ahead or
behind reads the same time as the others (``coordinator_service.clock.DatabaseClock``).

Without it, an instance five minutes ahead saw every other instance's lease as run out and
took them all, and once restarted on the true time its own leases were held for five
minutes by nobody."""

from __future__ import annotations

import time
from typing import Any, cast

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


class _HeldUp:
    """A connection whose queries reach the server ``delay_s`` late, as after a network
    partition: the server reads its clock on arrival."""

    def __init__(self, conn: sa.Connection, delay_s: float) -> None:
        self._conn = conn
        self._delay_s = delay_s

    def execute(self, query: sa.TextClause) -> sa.CursorResult[Any]:
        time.sleep(self._delay_s)
        return self._conn.execute(query)


def test_a_reading_held_up_on_its_way_is_not_used() -> None:
    clock = DatabaseClock(max_round_trip_s=0.2)
    with temp_database() as url:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                assert clock.sync(conn)
                # pinned halfway through a 1.2 s round trip, the reading would put the
                # clock 0.6 s ahead of the server's
                assert not clock.sync(cast(sa.Connection, _HeldUp(conn, 1.2)))
                drift = clock.now_ms() - _server_ms(conn)
        finally:
            engine.dispose()
    assert abs(drift) < 200, f"{drift} ms from the database's clock"
