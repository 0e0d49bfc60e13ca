"""The consumer groups' server-side assignor (coordinator_service/groups/assignor.py):
every subscribed partition goes to exactly one subscriber, the counts are balanced, and a
partition leaves its previous owner only when the balance needs it."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.groups.assignor import (
    MemberSubscription,
    TopicPartitionKey,
    assign,
)

pytestmark = pytest.mark.unit

Assignment = Mapping[str, Collection[TopicPartitionKey]]


def member(member_id: str, *topics: str) -> MemberSubscription:
    return MemberSubscription(member_id, frozenset(topics))


def partitions(topic: str, count: int) -> set[TopicPartitionKey]:
    return {(topic, p) for p in range(count)}


def check(
    members: Sequence[MemberSubscription], counts: Mapping[str, int], result: Assignment
) -> None:
    """Raise AssertionError naming the first broken invariant of ``result``."""
    ids = sorted(m.member_id for m in members)
    assert sorted(result) == ids, f"keys {sorted(result)} are not the members {ids}"
    topics = {m.member_id: m.topics for m in members}
    owner: dict[TopicPartitionKey, str] = {}
    for member_id in ids:
        for key in sorted(result[member_id]):
            topic, partition = key
            assert key not in owner, f"{key} given twice: {owner[key]} and {member_id}"
            assert topic in topics[member_id], f"{key} given to non-subscriber {member_id}"
            assert 0 <= partition < counts.get(topic, 0), f"{key} does not exist"
            owner[key] = member_id
    subscribed = set().union(*topics.values())
    wanted = {key for t in subscribed for key in partitions(t, counts.get(t, 0))}
    missing = sorted(wanted - owner.keys())
    assert not missing, f"unassigned: {missing}"
    # balanced as far as eligibility allows: nobody could take a partition of a member
    # with at least two more
    load = {member_id: len(result[member_id]) for member_id in ids}
    lightest: dict[str, int] = {}
    for m in members:
        for topic in m.topics:
            lightest[topic] = min(lightest.get(topic, load[m.member_id]), load[m.member_id])
    for key, member_id in sorted(owner.items()):
        assert lightest[key[0]] >= load[member_id] - 1, (
            f"unbalanced: {member_id} has {load[member_id]}, a subscriber of {key[0]} "
            f"has {lightest[key[0]]}"
        )
    effective = {frozenset(t for t in m.topics if counts.get(t, 0) > 0) for m in members}
    if len(effective) == 1:
        assert max(load.values()) - min(load.values()) <= 1, f"unbalanced: {load}"


def moved(previous: Assignment, result: Assignment) -> int:
    """How many partitions were taken from a member that is still in the group."""
    return sum(len(set(previous[m]) - set(result[m])) for m in previous if m in result)


# ---- the basics ----


def test_no_members_gives_nothing() -> None:
    assert assign([], {"t": 4}, {"gone": [("t", 0)]}) == {}


def test_a_member_of_no_existing_topic_is_still_a_key() -> None:
    result = assign([member("a", "missing"), member("b")], {"t": 2}, {})
    assert result == {"a": frozenset(), "b": frozenset()}


def test_one_member_gets_everything() -> None:
    counts = {"t1": 3, "t2": 5, "unread": 4}
    result = assign([member("a", "t1", "t2", "missing")], counts, {})
    assert result == {"a": frozenset(partitions("t1", 3) | partitions("t2", 5))}


def test_three_members_share_twelve_partitions_four_each() -> None:
    members = [member(m, "t") for m in "abc"]
    result = assign(members, {"t": 12}, {})
    check(members, {"t": 12}, result)
    assert [len(result[m]) for m in "abc"] == [4, 4, 4]


# ---- stickiness ----


def test_adding_a_member_moves_exactly_enough() -> None:
    counts = {"t": 12}
    before = assign([member(m, "t") for m in "abc"], counts, {})
    members = [member(m, "t") for m in "abcd"]
    after = assign(members, counts, before)
    check(members, counts, after)
    assert moved(before, after) == 3
    assert len(after["d"]) == 3
    for m in "abc":
        assert after[m] <= before[m]  # what a member keeps, it kept from before


def test_removing_a_member_moves_only_its_partitions() -> None:
    counts = {"t": 12}
    before = assign([member(m, "t") for m in "abcd"], counts, {})
    members = [member(m, "t") for m in "abc"]
    after = assign(members, counts, before)
    check(members, counts, after)
    for m in "abc":
        assert after[m] >= before[m]
    assert sum(len(after[m] - before[m]) for m in "abc") == len(before["d"]) == 3


def test_a_grown_topic_assigns_only_the_new_partitions() -> None:
    members = [member(m, "t") for m in "abc"]
    before = assign(members, {"t": 12}, {})
    after = assign(members, {"t": 15}, before)
    check(members, {"t": 15}, after)
    for m in "abc":
        assert before[m] <= after[m]
        assert after[m] - before[m] <= partitions("t", 15) - partitions("t", 12)
        assert len(after[m]) == 5


def test_a_deleted_topic_vanishes() -> None:
    members = [member(m, "t1", "t2") for m in "abc"]
    before = assign(members, {"t1": 6, "t2": 6}, {})
    after = assign(members, {"t1": 6}, before)
    check(members, {"t1": 6}, after)
    assert all(topic == "t1" for keys in after.values() for topic, _ in keys)
    kept = {m: {key for key in before[m] if key[0] == "t1"} for m in "abc"}
    assert moved(kept, after) == 0  # the t1 partitions were balanced already and stay put


def test_previous_entries_that_no_longer_apply_are_ignored() -> None:
    members = [member("a", "t"), member("b", "t", "u")]
    previous = {
        "gone": [("t", 0), ("t", 1)],
        "a": [("u", 0), ("t", 7), ("missing", 0), ("t", 2)],  # only ("t", 2) still holds
        "b": [("t", 2), ("u", 0)],  # ("t", 2) is a's: the first by member id keeps it
    }
    result = assign(members, {"t": 4, "u": 1}, previous)
    check(members, {"t": 4, "u": 1}, result)
    assert ("t", 2) in result["a"]
    assert ("u", 0) in result["b"]


def test_duplicate_members_and_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        assign([member("a", "t"), member("a", "t")], {"t": 1}, {})
    with pytest.raises(ValueError, match="negative"):
        assign([member("a", "t")], {"t": -1}, {})


# ---- different subscriptions ----


def test_heterogeneous_subscriptions_balance_as_far_as_eligibility_allows() -> None:
    members = [member("a", "t1"), member("b", "t1", "t2"), member("c", "t2")]
    counts = {"t1": 6, "t2": 6}
    result = assign(members, counts, {})
    check(members, counts, result)
    assert [len(result[m]) for m in "abc"] == [4, 4, 4]
    assert result["a"] <= partitions("t1", 6)
    assert result["c"] <= partitions("t2", 6)


def test_heterogeneous_subscriptions_that_cannot_balance() -> None:
    members = [member("a", "t1"), member("b", "t1", "t2"), member("c", "t2")]
    counts = {"t1": 2, "t2": 10}
    result = assign(members, counts, {})
    check(members, counts, result)
    # a can read only t1's two, so b and c share t2's ten
    assert result["a"] == partitions("t1", 2)
    assert [len(result[m]) for m in "bc"] == [5, 5]


def test_a_move_hands_over_a_new_partition_before_a_kept_one() -> None:
    # a keeps p0 and is given p2, q0 and q1 (c is busy with r); a is then two above b
    # and must hand b one of its partitions of p: p2, which a never started reading
    members = [member("a", "p", "q"), member("b", "p"), member("c", "q", "r")]
    counts = {"p": 3, "q": 2, "r": 10}
    previous = {"a": [("p", 0)], "b": [("p", 1)], "c": sorted(partitions("r", 10))}
    result = assign(members, counts, previous)
    check(members, counts, result)
    assert moved(previous, result) == 0
    assert result["a"] == {("p", 0), ("q", 0), ("q", 1)}
    assert result["b"] == {("p", 1), ("p", 2)}


# ---- determinism and scale ----


def test_the_same_input_gives_the_same_output() -> None:
    members = [member(f"m{i}", *(f"t{j}" for j in range(i % 4 + 1))) for i in range(10)]
    counts = {f"t{j}": 7 + j for j in range(4)}
    previous = {"m1": [("t0", 3), ("t0", 5)], "m7": [("t3", 1)]}
    first = assign(members, counts, previous)
    assert assign(members, counts, previous) == first
    shuffled = members[:]
    random.Random(7).shuffle(shuffled)
    reordered = {m: list(reversed(keys)) for m, keys in reversed(previous.items())}
    assert assign(shuffled, dict(reversed(counts.items())), reordered) == first


def test_two_thousand_members_and_ten_thousand_partitions() -> None:
    counts = {f"topic-{i:02d}": 200 for i in range(50)}
    members = [MemberSubscription(f"member-{i:04d}", frozenset(counts)) for i in range(2000)]
    result = assign(members, counts, {})
    check(members, counts, result)
    assert {len(keys) for keys in result.values()} == {5}
    joined = [*members[10:], MemberSubscription("late", frozenset(counts))]
    again = assign(joined, counts, result)
    check(joined, counts, again)
    assert moved(result, again) == 0  # the departed members' 50 partitions cover the rest


# ---- properties ----

TOPICS = ["t0", "t1", "t2", "t3"]
MEMBER_IDS = [f"m{i}" for i in range(8)]
KEYS = [(t, p) for t in [*TOPICS, "missing"] for p in range(14)]
topic_sets = st.frozensets(st.sampled_from([*TOPICS, "missing"]))
counts_strategy = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12))
previous_strategy = st.dictionaries(
    st.sampled_from(MEMBER_IDS), st.frozensets(st.sampled_from(KEYS), max_size=24)
)


def still_valid(
    members: Sequence[MemberSubscription], counts: Mapping[str, int], previous: Assignment
) -> dict[str, set[TopicPartitionKey]]:
    """The previous partitions a member could keep: it is still here and subscribed, the
    partition still exists, and no member before it by id listed it too."""
    claimed: set[TopicPartitionKey] = set()
    kept: dict[str, set[TopicPartitionKey]] = {}
    subscribed = {m.member_id: m.topics for m in members}
    for member_id in sorted(previous):
        if member_id in subscribed:
            kept[member_id] = {
                (t, p) for t, p in previous[member_id]
                if t in subscribed[member_id] and 0 <= p < counts.get(t, 0)
            } - claimed
            claimed |= kept[member_id]
    return kept


def least_moves(members: Sequence[MemberSubscription], counts: Mapping[str, int],
                kept: Assignment) -> int:
    """With one subscription for all: the fewest partitions any balanced assignment must
    take from the members that keep ``kept``."""
    total = sum(counts.get(t, 0) for t in members[0].topics)
    base, extra = divmod(total, len(members))
    over = sum(1 for keys in kept.values() if len(keys) >= base + 1)
    return sum(max(0, len(keys) - base - 1) for keys in kept.values()) + max(0, over - extra)


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.sampled_from(MEMBER_IDS), unique=True, max_size=7),
    data=st.data(),
    counts=counts_strategy,
    previous=previous_strategy,
    seed=st.integers(0, 1000),
)
def test_property_any_subscriptions(
    ids: list[str], data: st.DataObject, counts: dict[str, int],
    previous: dict[str, frozenset[TopicPartitionKey]], seed: int,
) -> None:
    members = [MemberSubscription(i, data.draw(topic_sets)) for i in ids]
    result = assign(members, counts, previous)
    check(members, counts, result)
    shuffled = members[:]
    random.Random(seed).shuffle(shuffled)
    assert assign(shuffled, counts, previous) == result
    assert assign(members, counts, result) == result  # a balanced result stays put


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.sampled_from(MEMBER_IDS), unique=True, min_size=1, max_size=7),
    topics=topic_sets,
    counts=counts_strategy,
    previous=previous_strategy,
)
def test_property_one_subscription_moves_the_least(
    ids: list[str], topics: frozenset[str], counts: dict[str, int],
    previous: dict[str, frozenset[TopicPartitionKey]],
) -> None:
    members = [MemberSubscription(i, topics) for i in ids]
    result = assign(members, counts, previous)
    check(members, counts, result)
    kept = still_valid(members, counts, previous)
    assert moved(kept, result) == least_moves(members, counts, kept)


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.sampled_from(MEMBER_IDS), unique=True, min_size=1, max_size=7),
    topics=topic_sets,
    counts=counts_strategy,
    data=st.data(),
)
def test_property_a_balanced_previous_assignment_is_returned_unchanged(
    ids: list[str], topics: frozenset[str], counts: dict[str, int], data: st.DataObject,
) -> None:
    members = [MemberSubscription(i, topics) for i in ids]
    every = sorted(key for t in topics for key in partitions(t, counts.get(t, 0)))
    dealt = data.draw(st.permutations(every))
    order = data.draw(st.permutations(ids))
    previous: dict[str, frozenset[TopicPartitionKey]] = {
        m: frozenset(dealt[n :: len(order)]) for n, m in enumerate(order)
    }
    departed = {m: frozenset(KEYS[:5]) for m in MEMBER_IDS if m not in ids}
    assert assign(members, counts, {**previous, **departed}) == previous


# ---- the checker itself ----


@pytest.mark.parametrize(
    ("result", "complaint"),
    [
        ({"a": {("t", 0), ("t", 1)}, "b": {("t", 1), ("t", 2), ("t", 3)}}, "given twice"),
        ({"a": {("t", 0), ("t", 1)}, "b": {("t", 2), ("u", 0)}}, "non-subscriber"),
        ({"a": {("t", 0), ("t", 1)}, "b": {("t", 2)}}, "unassigned"),
        ({"a": {("t", 0), ("t", 1), ("t", 2)}, "b": {("t", 3), ("t", 4)}}, "does not exist"),
        ({"a": {("t", 0), ("t", 1), ("t", 2)}, "b": {("t", 3)}}, "unbalanced"),
        ({"a": {("t", 0), ("t", 1)}}, "not the members"),
    ],
)
def test_the_checker_catches_planted_bugs(result: Assignment, complaint: str) -> None:
    members = [member("a", "t"), member("b", "t")]
    with pytest.raises(AssertionError, match=complaint):
        check(members, {"t": 4, "u": 1}, result)
    check(members, {"t": 4, "u": 1}, {"a": {("t", 0), ("t", 1)}, "b": {("t", 2), ("t", 3)}})
