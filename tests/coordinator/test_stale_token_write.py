"""A write fenced because it was made under an earlier lease of this very instance drops
nothing: the lease held now stays.

A coordinator that loses a transaction-log partition and takes it again (its renewal came
late on a loaded machine, or it was paused for a moment) holds it under a new coordinator
epoch, while requests that took their token before still write under the old one. Those
writes are fenced, rightly; but the partition used to be dropped for them, whatever epoch
was held by then. The next lease round took it again under yet another epoch, which fenced
the writes in flight under the one before, which dropped it again: the partition kept
unloading and loading, its markers abandoned each time, its requests answered
NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS (both retried silently by clients), for
as long as requests kept coming. Seen in the chaos runs as "lost transaction log
partition N" followed by "took transaction log partition N at coordinator epoch e+1" by
the same instance, several times a second."""

from __future__ import annotations

import time
from typing import Any

from coordinator_service.clock import FakeClock
from eos_protocol.errors import NotCoordinatorError
from tests.coordinator.helpers import add, describe, end, init, ok, topic
from tests.support.coordinators import FakeNodes

LEASE_MS = 600_000  # nothing renews (no background loops): no lease runs out by itself


def test_a_write_under_an_earlier_epoch_keeps_the_lease_held_now(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    clock = FakeClock(int(time.time() * 1000))
    a = coordinator_factory(background=False, lease_ms=LEASE_MS, lease_clock=clock)
    leases, coordinator = a.services.leases, a.services.coordinator
    with a.client() as ca:
        topic(ca)
        pid, epoch = init(ca, "s")
        p = coordinator.partition_of("s")
        stale = leases.token(p)
        assert stale is not None

        # The partition is lost (a fenced write under the lease held then) and taken
        # again at the next round, under the next coordinator epoch.
        a.call(lambda: leases.drop(p))
        assert p not in leases.owned
        a.call(leases.run_round)
        assert leases.owned.get(p) == stale.coordinator_epoch + 1

        # A request that took its token before writes under the old epoch: fenced.
        rec = coordinator.cache[p]["s"]

        async def late_write() -> None:
            await coordinator._write(rec, rec.replace(timeout_ms=rec.timeout_ms + 1), stale)

        try:
            a.call(late_write)
        except NotCoordinatorError:
            pass
        else:
            raise AssertionError("a write under an earlier coordinator epoch was not fenced")

        # ... and the lease held now stays, loaded: the id is served at once.
        assert leases.owned.get(p) == stale.coordinator_epoch + 1
        assert "s" in coordinator.cache.get(p, {})
        ok(add(ca, "s", pid, epoch, 0, 1))
        ok(end(ca, "s", pid, epoch))
        assert describe(ca, "s")["state"] == "CompleteCommit"
        assert leases.owned.get(p) == stale.coordinator_epoch + 1
