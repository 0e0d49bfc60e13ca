"""Which member of a consumer group reads which partition: the server-side "uniform"
assignor of Kafka's KIP-848, as a pure function (no I/O, standard library only).

Under KIP-848 the group coordinator, not a client leader, computes each member's *target*
assignment whenever the group or its topics change; members then converge on it through
heartbeats. The function here is that computation, and it aims at two things:

* **Sticky.** Every partition that changes owner costs a round trip: the old owner must
  revoke it (commit, stop fetching) and confirm before the new owner may be given it, and
  the partition is read by nobody in between. So a partition stays with its previous
  owner whenever that owner is still a member, still subscribes to its topic, and keeping
  it does not break the balance; with identical subscriptions the number of partitions
  taken from their owners is the least any balanced assignment needs.
* **Balanced.** Members are copies of one application sharing one stream; a member with
  twice the partitions of another is the group's bottleneck. With identical subscriptions
  the partition counts of any two members differ by at most one. With different
  subscriptions the result is a fixed point: no member holds a partition that a member
  subscribed to its topic, with at least two fewer partitions, could take. (Moves are
  single steps, not chains: a gives to b only if b is two below a, even where a-to-b and
  b-to-c together would even out a, b and c.)

The steps: keep the valid previous partitions; give every unowned partition to the least
loaded member subscribed to its topic; then, while some member could hand a partition to
an eligible member with at least two fewer, let the most loaded such member do so,
preferring partitions it was given in this round (moving those revokes nothing).

Members are handled sorted by id and partitions by (topic, partition), so the same input
always gives the same output. ``MemberSubscription.rack`` is accepted for the protocol's
sake but does not change the result: rack-aware placement needs the racks of each
partition's replicas, which this function is not given.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

TopicPartitionKey = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class MemberSubscription:
    """One member of the group and the topics it reads (a pattern already resolved)."""

    member_id: str
    topics: frozenset[str]
    rack: str | None = None  # accepted; does not change the result (see the module doc)


def assign(
    members: Sequence[MemberSubscription],
    partitions_per_topic: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartitionKey]],
) -> dict[str, frozenset[TopicPartitionKey]]:
    """The target assignment of every member in ``members`` (an empty set for a member
    given nothing).

    ``partitions_per_topic`` maps each existing topic to its partition count; subscribed
    topics missing from it are ignored. ``previous`` maps member ids to their previous
    target assignments; entries of departed members, of topics a member no longer
    subscribes to and of partitions that no longer exist are ignored, and a partition
    listed under several members stays with the first of them by member id.
    """
    ordered = sorted(members, key=lambda member: member.member_id)
    for before, after in pairwise(ordered):
        if before.member_id == after.member_id:
            raise ValueError(f"member {before.member_id!r} is listed twice")
    for topic, count in sorted(partitions_per_topic.items()):
        if count < 0:
            raise ValueError(f"topic {topic!r} has a negative partition count {count}")
    plan = _Plan(ordered, partitions_per_topic)
    plan.keep_previous(previous)
    plan.place_unowned()
    plan.rebalance()
    return plan.result()


@dataclass
class _Held:
    """What one member holds of one group's partitions."""

    new: list[TopicPartitionKey]  # given in this round: moving one revokes nothing
    sticky: list[TopicPartitionKey]  # kept from the previous assignment


class _Plan:
    """The assignment under construction. Members are indices into the sorted member
    list (so comparing indices compares ids); topics with the same subscribers form a
    *group*, the unit of eligibility: any partition of a group's topics may go to any of
    its members, and a member's load counts its partitions over all groups."""

    def __init__(
        self, ordered: list[MemberSubscription], partitions_per_topic: Mapping[str, int]
    ) -> None:
        self.ids = [member.member_id for member in ordered]
        self.index = {member_id: i for i, member_id in enumerate(self.ids)}
        self.subscribed = [member.topics for member in ordered]
        subscribers: dict[str, list[int]] = {}
        for i, member in enumerate(ordered):
            for topic in sorted(member.topics):
                if partitions_per_topic.get(topic, 0) > 0:
                    subscribers.setdefault(topic, []).append(i)
        # the topics to place, most constrained first (fewest subscribers), then by name
        self.topics = sorted(subscribers, key=lambda topic: (len(subscribers[topic]), topic))
        self.count = {topic: partitions_per_topic[topic] for topic in self.topics}
        self.group_of: dict[str, int] = {}
        self.group_members: list[tuple[int, ...]] = []
        self.member_groups: list[list[int]] = [[] for _ in ordered]
        numbering: dict[tuple[int, ...], int] = {}
        for topic in sorted(self.topics):
            key = tuple(subscribers[topic])
            if key not in numbering:
                numbering[key] = len(self.group_members)
                self.group_members.append(key)
                for i in key:
                    self.member_groups[i].append(numbering[key])
            self.group_of[topic] = numbering[key]
        self.load = [0] * len(ordered)
        self.owned: set[TopicPartitionKey] = set()
        # member -> group -> what it holds there; a member hands over its last one first
        self.holding: list[dict[int, _Held]] = [{} for _ in ordered]
        # per group, a heap of (load, member) with an entry for every member's current
        # load (entries of loads since changed are dropped when they reach the top)
        self.lightest: list[list[tuple[int, int]]] = []

    def keep_previous(self, previous: Mapping[str, Collection[TopicPartitionKey]]) -> None:
        for member_id in sorted(previous):
            i = self.index.get(member_id)
            if i is None:
                continue
            for topic, partition in sorted(previous[member_id]):
                key = (topic, partition)
                if (
                    topic in self.subscribed[i]
                    and 0 <= partition < self.count.get(topic, 0)
                    and key not in self.owned
                ):
                    self.owned.add(key)
                    self._hold(i, self.group_of[topic]).sticky.append(key)
                    self.load[i] += 1
        self.lightest = [[(self.load[i], i) for i in group] for group in self.group_members]
        for heap in self.lightest:
            heapq.heapify(heap)

    def place_unowned(self) -> None:
        for topic in self.topics:
            group = self.group_of[topic]
            for partition in range(self.count[topic]):
                key = (topic, partition)
                if key not in self.owned:
                    self.owned.add(key)
                    _, receiver = self._lightest(group)
                    self._hold(receiver, group).new.append(key)
                    self._add_load(receiver, 1)

    def rebalance(self) -> None:
        """Move partitions from the most loaded member that can hand one over until no
        member can. A member that cannot is set aside (``stuck``) until a member of one
        of the groups it holds partitions of drops to two below it; the sum of squared
        loads falls with every move, so the loop ends."""
        active = [(-load, i) for i, load in enumerate(self.load) if load > 0]
        heapq.heapify(active)
        stuck = [False] * len(self.load)
        # per group, a heap of (-load, member) of the stuck members holding its partitions
        stuck_by_group: list[list[tuple[int, int]]] = [[] for _ in self.group_members]
        while active:
            negative_load, donor = heapq.heappop(active)
            if stuck[donor] or -negative_load != self.load[donor]:
                continue  # a stale entry
            move = self._best_move(donor)
            if move is None:
                stuck[donor] = True
                for group in sorted(self.holding[donor]):
                    heapq.heappush(stuck_by_group[group], (negative_load, donor))
                continue
            _, _, receiver, group = move
            held = self.holding[donor][group]
            key = held.new.pop() if held.new else held.sticky.pop()
            if not held.new and not held.sticky:
                del self.holding[donor][group]
            self._hold(receiver, group).new.append(key)
            self._add_load(donor, -1)
            self._add_load(receiver, 1)
            stuck[receiver] = False
            heapq.heappush(active, (-self.load[donor], donor))
            heapq.heappush(active, (-self.load[receiver], receiver))
            # the donor is now lighter: stuck members that could give it a partition resume
            for group in self.member_groups[donor]:
                waiting = stuck_by_group[group]
                while waiting:
                    negative_load, member = waiting[0]
                    if stuck[member] and -negative_load == self.load[member]:
                        if -negative_load < self.load[donor] + 2:
                            break
                        stuck[member] = False
                        heapq.heappush(active, (negative_load, member))
                    heapq.heappop(waiting)

    def result(self) -> dict[str, frozenset[TopicPartitionKey]]:
        return {
            member_id: frozenset(
                key for held in self.holding[i].values() for key in (*held.new, *held.sticky)
            )
            for i, member_id in enumerate(self.ids)
        }

    def _best_move(self, donor: int) -> tuple[int, int, int, int] | None:
        """(0 for a partition given in this round or 1 for a kept one, the receiver's
        load, the receiver, the group) of the best partition ``donor`` can hand over to a
        member with at least two fewer partitions, or None."""
        best: tuple[int, int, int, int] | None = None
        for group, held in self.holding[donor].items():
            load, receiver = self._lightest(group)
            if load <= self.load[donor] - 2:
                candidate = (0 if held.new else 1, load, receiver, group)
                if best is None or candidate < best:
                    best = candidate
        return best

    def _lightest(self, group: int) -> tuple[int, int]:
        heap = self.lightest[group]
        while heap[0][0] != self.load[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0]

    def _add_load(self, member: int, change: int) -> None:
        self.load[member] += change
        for group in self.member_groups[member]:
            heapq.heappush(self.lightest[group], (self.load[member], member))

    def _hold(self, member: int, group: int) -> _Held:
        held = self.holding[member].get(group)
        if held is None:
            held = self.holding[member][group] = _Held([], [])
        return held
