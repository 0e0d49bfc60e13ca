"""Zombie fencing of transactional offset commits (KIP-447) at an in-process coordinator.

A transaction's AddOffsetsToTxn names the group member its offsets belong to; the
coordinator refuses it when the member no longer holds those partitions, and checks the
claim again at commit, so a copy fenced after its AddOffsetsToTxn cannot commit either.
The last test plants the bug (a coordinator that skips the check) and shows the zombie's
commit would then go through.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coordinator_service.clock import FakeClock
from coordinator_service.groups import fencing
from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import code, end, init, ok, topic
from tests.coordinator.test_groups_api import SESSION_MS, SimMember
from tests.support.coordinators import InProcessCoordinator


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fenced_coordinator(coordinator_factory: CoordinatorFactory, clock: FakeClock
                       ) -> InProcessCoordinator:
    return coordinator_factory(clock=clock, background=False,
                               group_session_timeout_ms=SESSION_MS)


def add_offsets(c: httpx.Client, tid: str, pid: int, epoch: int, member: SimMember | None,
                parts: set[tuple[str, int]] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"producer_id": pid, "producer_epoch": epoch, "group_id": "g"}
    if member is not None:
        body |= {"member_id": member.member_id, "member_epoch": member.epoch}
        owned = member.reading if parts is None else parts
        body["partitions"] = [{"topic": t, "partition": p} for t, p in sorted(owned)]
    return c.post(f"/v1/transactions/{tid}/offsets", json=body)


def expire_member(coordinator: InProcessCoordinator, clock: FakeClock,
                  keep: SimMember) -> None:
    clock.advance(SESSION_MS // 2)
    keep.beat()
    clock.advance(SESSION_MS // 2 + 1)
    assert coordinator.call(coordinator.services.groups.expire_once) == 1


def test_a_member_commits_offsets_of_its_own_partitions(
    fenced_coordinator: InProcessCoordinator,
) -> None:
    with fenced_coordinator.client() as c:
        topic(c, "in", 4)
        a, b = SimMember(c, "g", ["in"]), SimMember(c, "g", ["in"])
        for _ in range(4):
            a.beat()
            b.beat()
        pid, epoch = init(c, "copy-a")
        ok(add_offsets(c, "copy-a", pid, epoch, a))
        ok(end(c, "copy-a", pid, epoch))
        foreign = add_offsets(c, "copy-a", pid, epoch, a, parts=b.reading)
        assert code(foreign) == "FENCED_MEMBER_EPOCH"
        anonymous = add_offsets(c, "copy-a", pid, epoch, None)
        assert code(anonymous) == "UNKNOWN_MEMBER_ID"  # the group has members: name one


def test_a_zombie_can_neither_add_nor_commit_its_offsets(
    fenced_coordinator: InProcessCoordinator, clock: FakeClock,
) -> None:
    with fenced_coordinator.client() as c:
        topic(c, "in", 4)
        zombie, other = SimMember(c, "g", ["in"]), SimMember(c, "g", ["in"])
        for _ in range(4):
            zombie.beat()
            other.beat()
        pid, epoch = init(c, "copy-z")
        ok(add_offsets(c, "copy-z", pid, epoch, zombie))  # still a member here
        expire_member(fenced_coordinator, clock, keep=other)  # then it stalls
        refused = end(c, "copy-z", pid, epoch)
        assert refused.status_code == 404 and code(refused) == "UNKNOWN_MEMBER_ID"
        assert ok(c.get("/v1/transactions/copy-z"))["state"] == "Ongoing"
        ok(end(c, "copy-z", pid, epoch, action="abort"))
        again = add_offsets(c, "copy-z", pid, epoch, zombie)
        assert code(again) == "UNKNOWN_MEMBER_ID"


def test_the_check_catches_a_coordinator_that_skips_it(
    fenced_coordinator: InProcessCoordinator, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted bug: without the member check the zombie's commit goes through."""
    monkeypatch.setattr(fencing, "check_member", lambda *args: None)
    with fenced_coordinator.client() as c:
        topic(c, "in", 4)
        zombie, other = SimMember(c, "g", ["in"]), SimMember(c, "g", ["in"])
        pid, epoch = init(c, "copy-z")
        ok(add_offsets(c, "copy-z", pid, epoch, zombie))
        expire_member(fenced_coordinator, clock, keep=other)
        assert end(c, "copy-z", pid, epoch).status_code == 200  # what the check prevents
