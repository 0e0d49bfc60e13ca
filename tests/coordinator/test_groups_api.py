"""Consumer group membership at an in-process coordinator on PostgreSQL (KIP-848).

Members are driven by hand here, one heartbeat at a time, so every intermediate state can
be checked: no partition is ever in two members' assignments, revocation comes before a
partition moves, a stale epoch is fenced, a session that runs out (fake clock) frees the
member's partitions, a static member comes back to its own, and bad input changes
nothing. The SDK's members are tested against real processes elsewhere.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from coordinator_service.clock import FakeClock
from coordinator_service.groups.membership import NOTHING, Group
from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import code, ok, topic
from tests.support.coordinators import InProcessCoordinator

SESSION_MS = 10_000


def hb(c: httpx.Client, group: str, **body: Any) -> httpx.Response:
    return c.post(f"/v1/groups/{group}/heartbeat", json=body)


class SimMember:
    """A well-behaved client: it reads what its last answer assigned, and reports that."""

    def __init__(self, c: httpx.Client, group: str, topics: list[str], **join: Any) -> None:
        self.c, self.group = c, group
        answer = ok(hb(c, group, member_epoch=0, subscribed_topic_names=topics,
                       owned_partitions=[], **join))
        self.member_id: str = answer["member_id"]
        self.epoch: int = answer["member_epoch"]
        self.reading = {(tp["topic"], tp["partition"]) for tp in answer["assignment"]}

    def beat(self) -> None:
        owned = [{"topic": t, "partition": p} for t, p in sorted(self.reading)]
        answer = ok(hb(self.c, self.group, member_id=self.member_id, member_epoch=self.epoch,
                       owned_partitions=owned))
        self.epoch = answer["member_epoch"]
        self.reading = {(tp["topic"], tp["partition"]) for tp in answer["assignment"]}


def no_partition_read_twice(members: list[SimMember]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for m in members:
        for tp in m.reading:
            assert tp not in seen, f"{tp} read by {seen[tp]} and {m.member_id}"
            seen[tp] = m.member_id


def settle(members: list[SimMember], rounds: int = 6) -> None:
    for _ in range(rounds):
        for m in members:
            m.beat()
            no_partition_read_twice(members)


def counts(members: list[SimMember]) -> list[int]:
    return sorted(len(m.reading) for m in members)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def groups_coordinator(coordinator_factory: CoordinatorFactory, clock: FakeClock
                       ) -> InProcessCoordinator:
    return coordinator_factory(
        clock=clock, background=False, group_session_timeout_ms=SESSION_MS,
        group_heartbeat_interval_ms=1_000, group_max_size=20,
    )


def test_members_share_partitions_and_none_is_read_by_two(
    groups_coordinator: InProcessCoordinator,
) -> None:
    with groups_coordinator.client() as c:
        topic(c, "orders", 12)
        members = [SimMember(c, "g", ["orders"])]
        assert counts(members) == [12]
        for _ in range(2):
            members.append(SimMember(c, "g", ["orders"]))
            no_partition_read_twice(members)
            settle(members)
        assert counts(members) == [4, 4, 4]
        described = ok(c.get("/v1/groups/g"))
        assert described["state"] == "stable" and len(described["members"]) == 3
        assert len({m["member_epoch"] for m in described["members"]}) == 1
        gone = members.pop(0)
        left = ok(hb(c, "g", member_id=gone.member_id, member_epoch=-1))
        assert left["member_epoch"] == -1 and left["assignment"] == []
        settle(members)
        assert counts(members) == [6, 6]
        assert code(hb(c, "g", member_id=gone.member_id, member_epoch=gone.epoch)) == (
            "UNKNOWN_MEMBER_ID"
        )


def test_the_check_catches_a_coordinator_that_hands_out_held_partitions(
    groups_coordinator: InProcessCoordinator, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted bug: partitions given before their old owner let go of them."""
    monkeypatch.setattr(Group, "held_by_others", lambda self, member_id: NOTHING)
    with groups_coordinator.client() as c:
        topic(c, "orders", 12)
        members = [SimMember(c, "g", ["orders"]), SimMember(c, "g", ["orders"])]
        with pytest.raises(AssertionError, match="read by"):
            members[1].beat()
            no_partition_read_twice(members)


def test_revocation_comes_before_the_move_and_a_stale_epoch_is_fenced(
    groups_coordinator: InProcessCoordinator,
) -> None:
    with groups_coordinator.client() as c:
        topic(c, "orders", 4)
        a = SimMember(c, "g", ["orders"])
        b = SimMember(c, "g", ["orders"])
        assert b.reading == set()  # a still reads all four
        b.beat()
        assert b.reading == set()
        epoch_before = a.epoch
        owned_before = sorted(a.reading)
        a_owned = [{"topic": t, "partition": p} for t, p in owned_before]
        answer = ok(hb(c, "g", member_id=a.member_id, member_epoch=a.epoch,
                       owned_partitions=a_owned))
        assert len(answer["assignment"]) == 2  # two to let go of
        # a's answer was "lost": it repeats its heartbeat with everything still owned
        again = ok(hb(c, "g", member_id=a.member_id, member_epoch=epoch_before,
                      owned_partitions=a_owned))
        assert len(again["assignment"]) == 2
        b.beat()
        assert b.reading == set(), "b got partitions a has not let go of"
        a.reading = {(tp["topic"], tp["partition"]) for tp in again["assignment"]}
        a.epoch = again["member_epoch"]
        settle([a, b])
        assert counts([a, b]) == [2, 2] and a.epoch > epoch_before
        fenced = hb(c, "g", member_id=a.member_id, member_epoch=epoch_before,
                    owned_partitions=a_owned)
        assert fenced.status_code == 409 and code(fenced) == "FENCED_MEMBER_EPOCH"


def test_a_member_whose_session_ends_loses_its_partitions(
    groups_coordinator: InProcessCoordinator, clock: FakeClock,
) -> None:
    with groups_coordinator.client() as c:
        topic(c, "orders", 6)
        a, b = SimMember(c, "g", ["orders"]), SimMember(c, "g", ["orders"])
        settle([a, b])
        assert counts([a, b]) == [3, 3]
        clock.advance(SESSION_MS // 2)
        b.beat()
        clock.advance(SESSION_MS // 2 + 1)  # a silent for a whole session, b not
        removed = groups_coordinator.call(groups_coordinator.services.groups.expire_once)
        assert removed == 1
        settle([b])
        assert counts([b]) == [6]
        stale = hb(c, "g", member_id=a.member_id, member_epoch=a.epoch)
        assert code(stale) == "UNKNOWN_MEMBER_ID"


def test_a_static_member_comes_back_to_its_partitions_without_moving_others(
    groups_coordinator: InProcessCoordinator,
) -> None:
    with groups_coordinator.client() as c:
        topic(c, "orders", 6)
        a = SimMember(c, "g", ["orders"], instance_id="copy-a")
        b = SimMember(c, "g", ["orders"], instance_id="copy-b")
        settle([a, b])
        a_had, b_had = set(a.reading), set(b.reading)
        assert ok(hb(c, "g", member_id=a.member_id, member_epoch=-2))["member_epoch"] == -2
        settle([b])
        assert b.reading == b_had  # a's partitions wait for it
        again = SimMember(c, "g", ["orders"], instance_id="copy-a")
        assert again.member_id != a.member_id and again.reading == a_had
        settle([again, b])
        assert again.reading == a_had and b.reading == b_had
        in_use = hb(c, "g", member_epoch=0, instance_id="copy-b",
                    subscribed_topic_names=["orders"])
        assert code(in_use) == "UNRELEASED_INSTANCE_ID"


def test_a_pattern_picks_up_a_new_topic(groups_coordinator: InProcessCoordinator) -> None:
    with groups_coordinator.client() as c:
        topic(c, "events-a", 2)
        answer = ok(hb(c, "g", member_epoch=0, subscribed_topic_regex=r"events-.*",
                       owned_partitions=[]))
        member = SimMember.__new__(SimMember)
        member.c, member.group, member.member_id = c, "g", answer["member_id"]
        member.epoch = answer["member_epoch"]
        member.reading = {(tp["topic"], tp["partition"]) for tp in answer["assignment"]}
        assert member.reading == {("events-a", 0), ("events-a", 1)}
        topic(c, "events-b", 2)
        topic(c, "other", 2)
        member.beat()
        assert {t for t, _ in member.reading} == {"events-a", "events-b"}


def test_a_held_heartbeat_is_answered_when_the_assignment_moves(
    groups_coordinator: InProcessCoordinator,
) -> None:
    """With max_wait_ms the answer waits for a change; a join elsewhere is one. (If the
    wake-up did not work the held call would last its full minute and time out here.)"""
    with groups_coordinator.client() as c:
        topic(c, "orders", 4)
        a = SimMember(c, "g", ["orders"])
        a.beat()
        owned = [{"topic": t, "partition": p} for t, p in sorted(a.reading)]
        held: dict[str, Any] = {}

        def long_poll() -> None:
            with groups_coordinator.client(timeout=30) as c2:
                held["answer"] = ok(hb(c2, "g", member_id=a.member_id, member_epoch=a.epoch,
                                       owned_partitions=owned, max_wait_ms=60_000))

        thread = threading.Thread(target=long_poll)
        thread.start()
        SimMember(c, "g", ["orders"])
        thread.join(timeout=45)
        assert not thread.is_alive() and len(held["answer"]["assignment"]) == 2


def test_bad_input_is_refused_and_changes_nothing(
    groups_coordinator: InProcessCoordinator,
) -> None:
    with groups_coordinator.client() as c:
        topic(c, "orders", 2)
        a = SimMember(c, "g", ["orders"])
        before = ok(c.get("/v1/groups/g"))
        refusals = {
            "UNKNOWN_MEMBER_ID": hb(c, "g", member_id="nobody", member_epoch=3),
            "INVALID_REQUEST": hb(c, "g", member_epoch=0),  # a join with no subscription
            "UNKNOWN_TOPIC_OR_PARTITION": hb(c, "g", member_epoch=0,
                                             subscribed_topic_names=["missing"]),
            "INVALID_REGULAR_EXPRESSION": hb(c, "g", member_epoch=0,
                                             subscribed_topic_regex="(("),
            "FENCED_MEMBER_EPOCH": hb(c, "g", member_id=a.member_id, member_epoch=a.epoch + 7),
        }
        for expected, answer in refusals.items():
            assert code(answer) == expected, answer.text
        both = hb(c, "g", member_epoch=0, subscribed_topic_names=["orders"],
                  subscribed_topic_regex="o.*")
        assert code(both) == "INVALID_REQUEST"
        assert code(hb(c, "g", member_epoch=-5)) == "INVALID_REQUEST"
        assert ok(c.get("/v1/groups/g")) == before
        assert code(c.get("/v1/groups/none")) == "GROUP_ID_NOT_FOUND"
        assert code(c.delete("/v1/groups/g")) == "NON_EMPTY_GROUP"


def test_a_storm_of_joins_is_bounded(groups_coordinator: InProcessCoordinator) -> None:
    """One client joining over and over: the group stops at group_max_size (20 here),
    every join past it is refused clearly, and the group stays consistent."""
    with groups_coordinator.client() as c:
        topic(c, "orders", 8)
        answers = [hb(c, "g", member_epoch=0, subscribed_topic_names=["orders"])
                   for _ in range(500)]
        accepted = [a for a in answers if a.status_code == 200]
        refused = {code(a) for a in answers if a.status_code != 200}
        assert len(accepted) == 20 and refused == {"GROUP_MAX_SIZE_REACHED"}
        described = ok(c.get("/v1/groups/g"))
        assert len(described["members"]) == 20
        assigned = [(tp["topic"], tp["partition"]) for m in described["members"]
                    for tp in m["assignment"]]
        assert len(assigned) == len(set(assigned)) <= 8


def test_the_group_survives_its_coordinator(
    coordinator_factory: CoordinatorFactory, clock: FakeClock,
) -> None:
    first = coordinator_factory(clock=clock, background=False)
    with first.client() as c:
        topic(c, "orders", 4)
        a, b = SimMember(c, "g", ["orders"]), SimMember(c, "g", ["orders"])
        settle([a, b])
        had = {a.member_id: set(a.reading), b.member_id: set(b.reading)}
    first.stop()  # gives its leases up
    second = coordinator_factory(clock=clock, background=False)
    with second.client() as c:
        for m in (a, b):
            m.c = c
            m.beat()
        assert {a.member_id: a.reading, b.member_id: b.reading} == had
        assert ok(c.get("/v1/groups"))["groups"][0]["members"] == 2
