"""A lease round that loads many partitions keeps every lease of its instance alive while
it does.

The round renews at its start, then loads what it took one partition after another. An
instance taking over every partition of one that stopped, on a loaded machine, spent longer
than the lease loading them (seen in the chaos runs: 25 partitions in 1.6 to 3.5 s, with
leases of 2 s), so the leases it held before and the first ones it took had run out before
the round ended and the next could renew them: its own writes on them were fenced and the
partitions dropped and taken again, each time unloaded and loaded anew."""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa

from coordinator_service.clock import FakeClock
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.db.engine import Database, make_engine
from coordinator_service.db.migrate import upgrade
from coordinator_service.db.schema import leases
from coordinator_service.transactions.store import LeaseToken

LEASE_MS = 3_000
RENEW_MS = 1_000
PARTITIONS = 8


def test_leases_stay_alive_through_a_round_of_slow_loads(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine)
    db = Database(engine, threads=2)
    clock = FakeClock()

    async def slow_load(_token: LeaseToken) -> None:
        clock.advance(RENEW_MS // 2)  # each partition takes half a renewal interval to load

    async def nothing(_p: int) -> None:
        return None

    manager = LeaseManager(
        db, instance_id="i1", url="http://c1", node_id=1, partitions=PARTITIONS,
        lease_ms=LEASE_MS, renew_interval_ms=RENEW_MS, clock=clock,
        on_acquired=slow_load, on_lost=nothing,
    )  # fmt: skip

    def expiries(conn: sa.Connection) -> dict[int, int]:
        rows = conn.execute(sa.select(leases.c.log_partition, leases.c.expires_at_ms))
        return {int(p): int(e) for p, e in rows if 0 <= int(p) < PARTITIONS}

    try:
        asyncio.run(manager.start())  # one round: takes and loads every partition
        assert sorted(manager.owned) == list(range(PARTITIONS))
        now = clock.now_ms()
        run_out = {p: e for p, e in db.transaction(expiries).items() if e <= now}
        assert not run_out, f"leases run out by the end of the round that took them: {run_out}"
        assert all(manager.live_token(p) is not None for p in range(PARTITIONS))
    finally:
        engine.dispose()
