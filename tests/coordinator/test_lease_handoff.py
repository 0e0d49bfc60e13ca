"""Coordinators share the transaction-log partitions evenly and hand them over gracefully
(coordinator_service/cluster/leases.py, lease_balance.py): two and three in-process instances on
one PostgreSQL database, fake storage nodes, rounds run by hand."""

from __future__ import annotations

from typing import Any

from coordinator_service.transactions.state import txn_log_partition
from tests.coordinator.helpers import add, code, describe, end, init, ok, topic
from tests.support.coordinators import FakeNodes

PARTITIONS = 50

#: Longer than any test here runs, however loaded the machine: nothing renews a lease
#: between the rounds a test calls, and none of these tests waits for one to run out.
LEASE_MS = 60_000


def _tid_on(partitions: set[int], prefix: str) -> str:
    for i in range(10_000):
        tid = f"{prefix}-{i}"
        if txn_log_partition(tid, PARTITIONS) in partitions:
            return tid
    raise AssertionError("no transactional id found")


def _owned(coordinator: Any) -> set[int]:
    return set(coordinator.services.leases.owned)


def test_a_second_instance_gets_half_and_resumes_the_markers_handed_over(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    a = coordinator_factory(background=False, lease_ms=LEASE_MS)
    assert len(_owned(a)) == PARTITIONS
    moving = _tid_on(set(range(25, 50)), "moving")  # the highest partitions are given
    staying = _tid_on(set(range(0, 25)), "staying")
    with a.client() as ca:
        topic(ca)
        pid, epoch = init(ca, moving)
        ok(add(ca, moving, pid, epoch, 0, 1))
        fake_nodes.down.update({1, 2})  # the markers cannot be written yet
        assert ok(end(ca, moving, pid, epoch, wait=False))["state"] == "PrepareCommit"
        spid, sepoch = init(ca, staying)

        b = coordinator_factory(background=False, lease_ms=LEASE_MS)
        assert not _owned(b), "a holds every live lease: nothing is free for b"
        a.call(a.services.leases.run_round)  # a hands b's share over
        assert _owned(a) == set(range(25))
        # the markers could not drain (nodes down), yet the hand-over kept to its budget:
        # the leases a kept, renewed at the round's start, are still certainly live
        assert all(a.services.leases.live_token(p) is not None for p in range(25))
        assert not a.services.leases.leaving
        # a no longer answers for the moving id, and the id's markers are not a's job
        response = ca.post(f"/v1/transactions/{moving}/init", json={})
        assert code(response) in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE")
        assert moving not in a.services.markers.jobs

        b.call(b.services.leases.run_round)  # b takes them and resumes the markers
        assert _owned(b) == set(range(25, 50))
        fake_nodes.down.clear()
        with b.client() as cb:
            assert ok(end(cb, moving, pid, epoch, wait=True))["state"] == "CompleteCommit"
            assert describe(cb, moving)["coordinator_epoch"] == 2
            found = ok(cb.get("/v1/coordinators", params={"key": moving}))
            assert found["url"] == b.url
        commits = [m for _n, m in fake_nodes.markers_for(pid) if m["result"] == "COMMIT"]
        assert {m["coordinator_epoch"] for m in commits} == {2}
        assert {tp["partition"] for m in commits for tp in m["partitions"]} == {0, 1}
        # the partitions a kept are untouched: the staying id carries on at a
        ok(add(ca, staying, spid, sepoch, 2))
        assert ok(end(ca, staying, spid, sepoch))["state"] == "CompleteCommit"
    # nothing moves once the shares are even
    a.call(a.services.leases.run_round)
    b.call(b.services.leases.run_round)
    assert len(_owned(a)) == len(_owned(b)) == 25


def test_three_instances_split_seventeen_seventeen_sixteen_and_a_leaver_is_covered(
    coordinator_factory: Any,
) -> None:
    instances = [coordinator_factory(background=False, lease_ms=LEASE_MS) for _ in range(3)]
    for _ in range(3):
        for c in instances:
            c.call(c.services.leases.run_round)
    counts = sorted(len(_owned(c)) for c in instances)
    assert counts == [16, 17, 17]
    owned = [_owned(c) for c in instances]
    assert set().union(*owned) == set(range(PARTITIONS))
    assert sum(len(o) for o in owned) == PARTITIONS, "no partition has two owners"

    leaver = instances.pop()
    leaver.stop()  # a clean stop releases its leases and says goodbye
    for c in instances:
        c.call(c.services.leases.run_round)
    assert sorted(len(_owned(c)) for c in instances) == [25, 25]


def test_a_restart_under_the_same_instance_id_takes_its_partitions_back_at_once(
    coordinator_factory: Any, pg_url: str
) -> None:
    """The earlier process (paused here, in real life dead) still holds live leases under
    the id; the new one takes them back without waiting for them to run out, at a new
    coordinator epoch, so the earlier one can write nothing any more."""
    old = coordinator_factory(background=False, lease_ms=30_000, instance_id="fixed-0")
    assert len(_owned(old)) == PARTITIONS
    new = coordinator_factory(background=False, lease_ms=30_000, instance_id="fixed-0")
    assert _owned(new) == set(range(PARTITIONS))
    assert set(new.services.leases.owned.values()) == {2}
    with old.client() as client:
        response = client.post("/v1/transactions/anyone/init", json={})
        assert code(response) in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE")
