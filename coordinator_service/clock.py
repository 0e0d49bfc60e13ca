"""Clocks in milliseconds, injected so timeouts and expiry can be tested without sleeping.

The coordinator reads time only through a ``Clock``. Several instances sharing PostgreSQL
use ``DatabaseClock``: lease expiries, instance heartbeats and transaction deadlines are
written by one instance and judged by another, so they must be on one timeline, and a
machine whose wall clock runs minutes ahead would otherwise see every other instance's
lease as run out (and take it), or keep its own for minutes after it stopped renewing.
One instance on SQLite uses ``SystemClock``; tests hand a ``FakeClock`` to ``create_app``
and move it forward by hand.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: The database's clock in milliseconds since the epoch (PostgreSQL).
_DATABASE_NOW = sa.text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""
        ...


class SystemClock:
    """Wall-clock time; several instances on one machine agree on it (lease expiry)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class DatabaseClock:
    """The database server's clock, carried forward between readings by this machine's
    monotonic clock (which no wall-clock step or skew moves).

    ``sync`` reads the server's time and pins it to the local monotonic instant halfway
    through the round trip, so instances agree within half a round trip whatever their
    own wall clocks say. A reading is only as good as its round trip is short: a query
    held up on its way to the server (a network partition, a retransmission after one)
    is answered with the time it arrived, and pinned halfway would set the clock ahead
    by half the delay, enough to take other instances' leases early. So a reading whose
    round trip took longer than ``max_round_trip_s`` is not used while an earlier one
    stands (the monotonic clock carries that one forward exactly), and the first one is
    the best of a few. It is called before anything reads the clock, then every lease
    round; until the first reading ``now_ms`` is the local wall clock."""

    def __init__(self, max_round_trip_s: float = 0.5) -> None:
        self._lock = threading.Lock()
        self._base_ms: int | None = None
        self._base_monotonic = 0.0
        self._base_round_trip_s = float("inf")
        self.max_round_trip_s = max_round_trip_s

    def now_ms(self) -> int:
        with self._lock:
            if self._base_ms is None:
                return time.time_ns() // 1_000_000
            return self._base_ms + int((time.monotonic() - self._base_monotonic) * 1000)

    def sync(self, conn: Connection, attempts: int = 1) -> bool:
        """Read the database's clock (on a connection of ``Database.run``), up to
        ``attempts`` times while the round trips are too slow; whether a reading was
        taken. The first reading takes the quickest of its attempts whatever it took."""
        for _ in range(attempts):
            sent = time.monotonic()
            server_ms = int(conn.execute(_DATABASE_NOW).scalar_one())
            received = time.monotonic()
            round_trip = received - sent
            with self._lock:
                first = self._base_ms is None or self._base_round_trip_s > self.max_round_trip_s
                if round_trip <= self.max_round_trip_s or (
                    first and round_trip < self._base_round_trip_s
                ):
                    self._base_ms = server_ms
                    self._base_monotonic = (sent + received) / 2
                    self._base_round_trip_s = round_trip
                if round_trip <= self.max_round_trip_s:
                    return True
        return False


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms

    def set(self, ms: int) -> None:
        with self._lock:
            self._now = ms
