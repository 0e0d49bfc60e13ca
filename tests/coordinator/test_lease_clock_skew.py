"""Two coordinators on one PostgreSQL, the second with its wall clock five minutes ahead
(libfaketime): the leases stay shared and none changes hands while both live, and the
skewed one killed, its leases are taken over within the lease time, not five minutes.

On their own wall clocks the skewed instance saw every lease of the other as run out and
took it each round, and the expiries it wrote held its own leases for five minutes after
it died; on the database's clock (``DatabaseClock``) skew changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.jepsen.hosts import SKEWED_BOOT, skewed
from tests.support.cluster import ClusterFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LEASE_MS = 3000
SKEW_S = 300.0


def _leases(url: str) -> dict[int, tuple[str | None, int]]:
    """Each transaction-log partition's owner and coordinator epoch."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = "SELECT log_partition, owner, coordinator_epoch FROM leases"
            rows = conn.execute(sa.text(query + " WHERE log_partition >= 0"))
            return {int(r[0]): (r[1], int(r[2])) for r in rows}
    finally:
        engine.dispose()


def _poll(what: str, deadline_s: float, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.2)


def test_a_coordinator_minutes_ahead_takes_no_lease_early(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        nodes=1, coordinators=2, database="postgres", lease_ms=LEASE_MS, start=False
    )
    ahead = cluster.coordinators[1]
    module_at = ahead.argv.index("-m")
    ahead.argv[module_at : module_at + 1] = ["-c", SKEWED_BOOT]
    ahead.env = skewed(ahead.env, SKEW_S)
    cluster.start()
    url = cluster.database_url
    assert url is not None

    def shared() -> bool:
        owners = {owner for owner, _ in _leases(url).values()}
        return len(owners) == 2 and None not in owners

    _poll("the leases shared by both instances", 60, shared)
    before = _leases(url)
    # three lease times: on wall clocks the skewed instance took the other's leases at
    # each of its rounds (every third of the lease time)
    time.sleep(3 * LEASE_MS / 1000)
    after = _leases(url)
    moved = {p: (before[p], after[p]) for p in before if before[p] != after[p]}
    assert not moved, f"leases changed hands with both instances alive: {moved}"

    ahead.kill()
    # its leases run out on the shared clock, not five minutes later on its own: taken
    # within the lease time, well inside a deadline sized for a loaded machine

    def taken_over() -> bool:
        owners = {owner for owner, _ in _leases(url).values()}
        return len(owners) == 1

    _poll("the killed instance's leases taken over", 60, taken_over)
