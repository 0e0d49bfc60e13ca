"""A lease round that fails (the database out of reach) waits the renewal interval before
the next one. It used to start the next at once whenever another instance's lease had
seemed to run out at the last successful round: a coordinator cut from PostgreSQL then ran
dozens of failing rounds a second (seen in the Jepsen-style runs, fault ``pg-cut``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import pytest

from coordinator_service.clock import FakeClock
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.db.engine import Database

pytestmark = pytest.mark.unit

RENEW_MS = 400


class _Away:
    """A database that is out of reach: every call fails, and is counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, fn: Any, *args: Any) -> Any:
        self.calls += 1
        raise ConnectionError("the database is out of reach")


async def _rounds_in(seconds: float) -> int:
    db = _Away()
    clock = FakeClock()

    async def nothing(*_: Any) -> None:
        return None

    leases = LeaseManager(
        cast(Database, db), instance_id="i1", url="http://c1", node_id=1, partitions=4,
        lease_ms=3 * RENEW_MS, renew_interval_ms=RENEW_MS, clock=clock,
        on_acquired=nothing, on_lost=nothing,
    )  # fmt: skip
    # the last good round saw another instance's lease run out just now
    leases._foreign_expiry = clock.now_ms() - 1
    task = asyncio.create_task(leases.run_forever())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return db.calls


def test_a_failed_round_waits_the_renewal_interval() -> None:
    calls = asyncio.run(_rounds_in(3 * RENEW_MS / 1000))
    # the first round comes at once (the expiry it saw); then one per renewal interval
    assert 1 <= calls <= 4, f"{calls} rounds tried in three renewal intervals"
