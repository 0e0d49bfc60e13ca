"""The fair-share rule of the coordinators' leases (coordinator_service/cluster/lease_balance.py),
checked by simulating rounds of several instances over one shared lease table."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.cluster.lease_balance import (
    LeasePicture,
    LeaseRow,
    fair_shares,
    plan_round,
)

pytestmark = pytest.mark.unit

P = 50


class Table:
    """A lease table with instant hand-over: what a round gives is free at once."""

    def __init__(self, partitions: int = P) -> None:
        self.owner: dict[int, str | None] = dict.fromkeys(range(partitions))
        self.partitions = partitions

    def picture(self, me: str, beating: set[str]) -> LeasePicture:
        rows = tuple(LeaseRow(p, o, o is not None) for p, o in self.owner.items())
        return LeasePicture(me, self.partitions, rows, frozenset(beating))

    def owned(self, me: str) -> dict[int, int]:
        return {p: 1 for p, o in self.owner.items() if o == me}

    def round(self, me: str, beating: set[str]) -> None:
        plan = plan_round(self.picture(me, beating), self.owned(me))
        for p in plan.give:
            self.owner[p] = None
        free = sorted(p for p, o in self.owner.items() if o is None)
        for p in free[: plan.take]:
            self.owner[p] = me

    def counts(self) -> dict[str | None, int]:
        found: dict[str | None, int] = {}
        for o in self.owner.values():
            found[o] = found.get(o, 0) + 1
        return found


def settle(table: Table, live: list[str], rounds: int = 6, seed: int = 0) -> int:
    """Run rounds in a shuffled order until nothing moves; the number of moves."""
    rng = random.Random(seed)
    moves = 0
    for _ in range(rounds):
        before = dict(table.owner)
        order = list(live)
        rng.shuffle(order)
        for me in order:
            table.round(me, set(live))
        moves += sum(1 for p in before if before[p] != table.owner[p])
    return moves


def test_shares_add_up_and_differ_by_at_most_one() -> None:
    shares = fair_shares(["c", "a", "b"], 50)
    assert shares == {"a": 17, "b": 17, "c": 16}
    assert fair_shares([], 50) == {}
    assert fair_shares(["x"], 50) == {"x": 50}


def test_a_joining_instance_gets_half_and_nothing_moves_twice() -> None:
    table = Table()
    settle(table, ["a"])
    assert table.counts() == {"a": 50}
    table.round("b", {"a", "b"})  # b sees a holding everything: it takes nothing yet
    assert table.counts() == {"a": 50}
    table.round("a", {"a", "b"})  # a gives b's share away
    assert table.counts() == {"a": 25, None: 25}
    table.round("a", {"a", "b"})  # a does not take them back
    assert table.counts() == {"a": 25, None: 25}
    table.round("b", {"a", "b"})
    assert table.counts() == {"a": 25, "b": 25}
    assert settle(table, ["a", "b"]) == 0


def test_a_dead_instances_partitions_are_shared_by_the_survivors() -> None:
    """A killed instance's heartbeat is older than half the lease time by the time its
    leases run out (it beat every third of it): the survivors' shares cover it at once."""
    table = Table()
    settle(table, ["a", "b", "c"])
    assert sorted(table.counts().values()) == [16, 17, 17]
    for p, o in table.owner.items():
        if o == "c":
            table.owner[p] = None
    table.round("a", {"a", "b"})
    table.round("b", {"a", "b"})
    assert table.counts() == {"a": 25, "b": 25}


def test_a_surplus_is_only_given_to_someone_short_of_it() -> None:
    table = Table(4)
    table.owner = {0: "a", 1: "a", 2: "a", 3: None}
    plan = plan_round(table.picture("a", {"a", "b"}), table.owned("a"))
    assert plan.give == (2,), "the free partition covers half of b's share"
    table.owner[3] = "a"
    plan = plan_round(table.picture("a", {"a", "b"}), table.owned("a"))
    assert plan.give == (3, 2) and plan.imbalanced
    plan = plan_round(table.picture("a", {"a"}), table.owned("a"))
    assert plan.give == () and plan.idle, "alone, an instance keeps everything"


@settings(max_examples=200, deadline=None)
@given(
    partitions=st.integers(min_value=1, max_value=64),
    steps=st.lists(st.tuples(st.sampled_from("abcde"), st.booleans()), max_size=12),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_any_history_of_joins_and_leaves_ends_balanced(
    partitions: int, steps: list[tuple[str, bool]], seed: int
) -> None:
    table = Table(partitions)
    live = ["a"]
    settle(table, live, seed=seed)
    for name, joins in steps:
        if joins and name not in live:
            live.append(name)
        elif not joins and name in live and len(live) > 1:
            live.remove(name)
            for p, o in table.owner.items():
                if o == name:
                    table.owner[p] = None
        table.round(name if name in live else live[0], set(live))
    settle(table, live, rounds=8, seed=seed)
    counts = table.counts()
    assert None not in counts, "a partition was left without an owner"
    assert set(counts) <= set(live)
    shares = [counts.get(name, 0) for name in live]
    assert sum(shares) == partitions
    assert max(shares) - min(shares) <= 1
    assert settle(table, live, seed=seed + 1) == 0, "a balanced table must stay still"
