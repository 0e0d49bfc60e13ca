"""Two coordinators on one database: routing to the owner, takeover, and a late write of a
paused ex-owner that must change nothing (the same scenario with real processes and
SIGSTOP is in test_failover.py)."""

from __future__ import annotations

import time
from typing import Any

from coordinator_service.clock import FakeClock
from tests.coordinator.helpers import add, code, describe, end, init, ok, topic, transaction_row
from tests.support.coordinators import FakeNodes

#: A's lease: longer than any test here runs, however loaded the machine. A renews
#: nothing (no background loops), so with a lease of seconds a slow start of B could make
#: A give its partitions up before the test had even begun.
A_LEASE_MS = 600_000
#: B's: its clock is moved past A's lease, not waited for.
B_LEASE_MS = 5_000


def past_a_lease(b_clock: FakeClock) -> None:
    """B's clock past every lease A took (A stops renewing: think paused)."""
    b_clock.set(int(time.time() * 1000) + A_LEASE_MS + 1_000)


def test_takeover_fences_the_ex_owner(
    coordinator_factory: Any, pg_url: str, fake_nodes: FakeNodes
) -> None:
    a = coordinator_factory(background=False, lease_ms=A_LEASE_MS)
    b_clock = FakeClock(int(time.time() * 1000))
    b = coordinator_factory(background=False, lease_ms=B_LEASE_MS, lease_clock=b_clock)
    assert len(a.services.leases.owned) == 50 and not b.services.leases.owned
    with a.client() as ca, b.client() as cb:
        topic(ca)
        pid, epoch = init(ca, "f")
        ok(add(ca, "f", pid, epoch, 0, 1))
        # B is not the coordinator of "f" and says who is.
        response = cb.post("/v1/transactions/f/init", json={})
        assert response.status_code == 503 and code(response) == "NOT_COORDINATOR"
        assert response.json()["error"]["details"]["coordinator_url"] == a.url
        assert a.url in response.json()["error"]["message"]
        found = ok(cb.get("/v1/coordinators", params={"key": "f"}))
        assert found["url"] == a.url
        # Any instance describes and verifies from the database.
        assert describe(cb, "f")["state"] == "Ongoing"

        # A stops renewing (think: paused); once its lease ran out B takes every partition.
        past_a_lease(b_clock)
        b.call(b.services.leases.run_round)
        assert len(b.services.leases.owned) == 50
        before = transaction_row(pg_url, "f")
        assert before["coordinator_epoch"] == 1

        # A wakes up still believing it owns "f": its writes change nothing.
        response = end(ca, "f", pid, epoch, wait=False)
        assert code(response) == "NOT_COORDINATOR"
        assert transaction_row(pg_url, "f") == before
        assert code(ca.post("/v1/transactions/g/init", json={})) in (
            "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE")

        # B carries on with the loaded state, at coordinator epoch 2.
        assert ok(end(cb, "f", pid, epoch))["state"] == "CompleteCommit"
        commits = [m for _n, m in fake_nodes.markers_for(pid) if m["result"] == "COMMIT"]
        assert commits and all(m["coordinator_epoch"] == 2 for m in commits)
        assert transaction_row(pg_url, "f")["coordinator_epoch"] == 2
        found = ok(ca.get("/v1/coordinators", params={"key": "f"}))
        assert found["url"] == b.url


def test_late_marker_of_ex_owner_is_fenced_by_the_node(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    """A Prepare* left by the ex-owner is finished by the new owner; the ex-owner's markers,
    carrying the older coordinator epoch, are refused by the node and it gives up."""
    a = coordinator_factory(background=False, lease_ms=A_LEASE_MS)
    b_clock = FakeClock(int(time.time() * 1000))
    b = coordinator_factory(background=False, lease_ms=B_LEASE_MS, lease_clock=b_clock)
    with a.client() as ca, b.client() as cb:
        topic(ca)
        pid, epoch = init(ca, "m")
        ok(add(ca, "m", pid, epoch, 0, 1, 2, 3))
        fake_nodes.down.update({1, 2})
        ok(end(ca, "m", pid, epoch, wait=False))
        past_a_lease(b_clock)
        b.call(b.services.leases.run_round)  # B loads PrepareCommit and resumes markers
        fake_nodes.down.clear()
        ok(end(cb, "m", pid, epoch, wait=True))
        assert describe(cb, "m")["state"] == "CompleteCommit"
        # A's marker job meets the node's newer coordinator epoch and is dropped.
        from tests.support.processes import wait_until

        wait_until(lambda: "m" not in a.services.markers.jobs, timeout=10,
                   what="ex-owner to give up its markers")
