"""Subscribed consumers on a real cluster (a coordinator, two storage nodes): the group's
coordinator shares a topic's partitions out among them, moves them when a member comes or
goes, revokes before it reassigns, and fences a member that stopped heartbeating.

The coordinator runs with a 3 s session and a 500 ms heartbeat interval, so a stalled
member is removed within seconds. Every wait is a poll with a deadline. One test thread
polls all the blocking consumers of a test in turn, so the order of the callbacks it
records is the order in which they ran.

Shown: two members read each record exactly once (the one that loses partitions commits
in on_revoked, the one that gets them starts there), and one that unsubscribes leaves at
once; a third member takes two partitions from each, every one revoked before it is
assigned again; a closed member's partitions go to the others; a consume-transform-produce
loop (subscribed by pattern) commits its offsets with the member's metadata; a member
whose heartbeats stop past its session cannot commit its transaction (refused at
AddOffsetsToTxn, or at the commit when it was fenced after it) and its output stays
invisible once aborted; it learns of the loss at its next poll (on_lost) and joins again.
The async consumer does the same with coroutine callbacks, and a zombie's close reports
its partitions lost rather than revoking (and committing) them.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest

from sdk import (
    AsyncConsumer,
    AsyncTransactionalProducer,
    Consumer,
    ConsumerRecord,
    FencedMemberEpochError,
    IllegalStateError,
    Producer,
    ProducerState,
    TopicPartition,
    TransactionalProducer,
    UnknownMemberIdError,
)
from tests.sdk.helpers import read_topic
from tests.support.cluster import Cluster, ClusterFactory

pytestmark = pytest.mark.slow

PARTITIONS = 6
SESSION_MS = 3_000
GROUP_FLAGS = (
    "--group-session-timeout-ms", str(SESSION_MS),
    "--group-heartbeat-interval-ms", "500",
    "--group-rebalance-timeout-ms", "20000",
)  # fmt: skip
FENCED = (FencedMemberEpochError, UnknownMemberIdError)
Event = tuple[str, str, frozenset[TopicPartition]]


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Iterator[Cluster]:
    yield module_cluster_factory(coordinator_flags=GROUP_FLAGS)


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(cluster: Cluster, topic: str, per_partition: int, tag: str,
             partitions: int = PARTITIONS) -> None:
    with Producer(cluster.url) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, f"{tag}-{p}-{i}", partition=p)
        producer.flush()


def _members(cluster: Cluster, group: str) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.url}/v1/groups/{group}", timeout=10)
    if answer.status_code == 404:
        return {}
    assert answer.status_code == 200, answer.text
    return {m["member_id"]: m for m in answer.json()["members"]}


class Member:
    """A blocking consumer subscribed to ``topic``, recording its callbacks in ``log``
    and the records its polls returned; on_revoked commits the revoked positions."""

    def __init__(self, cluster: Cluster, name: str, group: str, topic: str,
                 log: list[Event], **kwargs: Any) -> None:
        self.name, self.log = name, log
        self.records: list[ConsumerRecord] = []
        self.consumer = Consumer(cluster.url, group_id=group, **kwargs)
        self.consumer.subscribe([topic], on_assigned=self._assigned, on_revoked=self._revoked,
                                on_lost=self._lost)  # fmt: skip

    def _assigned(self, parts: set[TopicPartition]) -> None:
        self.log.append(("assigned", self.name, frozenset(parts)))

    def _revoked(self, parts: set[TopicPartition]) -> None:
        self.log.append(("revoked", self.name, frozenset(parts)))
        self.consumer.commit({tp: self.consumer.position(tp) for tp in parts})

    def _lost(self, parts: set[TopicPartition]) -> None:
        self.log.append(("lost", self.name, frozenset(parts)))

    def poll(self) -> None:
        self.records.extend(self.consumer.poll(timeout=0.1))

    @property
    def owned(self) -> set[TopicPartition]:
        return self.consumer.assignment()


def _pump(members: Iterable[Member], until: Callable[[], bool], what: str,
          timeout: float = 45.0) -> None:
    """Poll every member in turn until ``until()`` holds."""
    members = list(members)
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for member in members:
            member.poll()


def _split(members: list[Member], sizes: list[int], topic: str) -> Callable[[], bool]:
    every = {TopicPartition(topic, p) for p in range(PARTITIONS)}

    def done() -> bool:
        owned = [m.owned for m in members]
        return sorted(len(o) for o in owned) == sorted(sizes) and set().union(*owned) == every
    return done


def _read_once(members: list[Member], expected: int) -> Callable[[], bool]:
    return lambda: sum(len(m.records) for m in members) >= expected


def _assert_each_once(members: list[Member], expected: int) -> None:
    seen = Counter((r.partition, r.offset) for m in members for r in m.records)
    assert sum(seen.values()) == expected and set(seen.values()) == {1}, seen.most_common(3)


def _assert_revoked_before_assigned(log: list[Event]) -> None:
    """A partition assigned to a member after it was another's was revoked (or lost)
    there first."""
    holder: dict[TopicPartition, str] = {}
    for kind, name, parts in log:
        for tp in parts:
            if kind == "assigned":
                assert tp not in holder, f"{tp} given to {name} while {holder[tp]} held it"
                holder[tp] = name
            else:
                assert holder.pop(tp, None) == name, (kind, name, tp)


def test_two_members_share_a_topic_and_read_each_record_once(cluster: Cluster) -> None:
    topic, group, log = cluster.create_topic(PARTITIONS, "share"), _uid("g"), []
    _produce(cluster, topic, 5, "before")
    a = Member(cluster, "a", group, topic, log)
    b: Member | None = None
    try:
        _pump([a], lambda: len(a.owned) == PARTITIONS and len(a.records) > 0, "a alone")
        b = Member(cluster, "b", group, topic, log)
        _pump([a, b], _split([a, b], [3, 3], topic), "a 3/3 split")
        assert not a.owned & b.owned
        _produce(cluster, topic, 5, "after")
        _pump([a, b], _read_once([a, b], 2 * 5 * PARTITIONS), "every record")
        _assert_each_once([a, b], 2 * 5 * PARTITIONS)
        _assert_revoked_before_assigned(log)
        assert {p for kind, name, parts in log if kind == "revoked" for p in parts} == b.owned
        metadata = [m.consumer.group_metadata() for m in (a, b)]
        assert len({md.member_id for md in metadata}) == 2
        assert all(md.group_id == group and md.member_epoch >= 1 for md in metadata)
        with pytest.raises(IllegalStateError, match="exclude each other"):
            a.consumer.assign([(topic, 0)])
        held, a_id = frozenset(a.owned), metadata[0].member_id
        a.consumer.unsubscribe()  # revoked (committed), then left: b takes everything
        assert log[-1] == ("revoked", "a", held)
        assert a_id not in _members(cluster, group)
        _pump([b], lambda: len(b.owned) == PARTITIONS, "b alone")
        a.consumer.assign([(topic, 0)])  # by hand, now that it is no member
    finally:
        for member in (a, b):
            if member is not None:
                member.consumer.close()


def test_a_third_member_takes_two_and_each_is_revoked_first(cluster: Cluster) -> None:
    topic, group, log = cluster.create_topic(PARTITIONS, "third"), _uid("g"), []
    members = [Member(cluster, n, group, topic, log) for n in ("a", "b")]
    try:
        _pump(members, _split(members, [3, 3], topic), "a 3/3 split")
        _produce(cluster, topic, 4, "before")
        _pump(members, _read_once(members, 4 * PARTITIONS), "the first records")
        members.append(Member(cluster, "c", group, topic, log))
        _pump(members, _split(members, [2, 2, 2], topic), "a 2/2/2 split")
        _produce(cluster, topic, 4, "after")
        _pump(members, _read_once(members, 8 * PARTITIONS), "every record")
        _assert_each_once(members, 8 * PARTITIONS)
        _assert_revoked_before_assigned(log)
        moved = {tp for kind, name, parts in log if kind == "revoked" for tp in parts}
        assert moved >= members[2].owned  # c got only partitions revoked elsewhere first
        assert len(_members(cluster, group)) == 3
    finally:
        for member in members:
            member.consumer.close()


def test_a_closed_member_s_partitions_go_to_the_others(cluster: Cluster) -> None:
    topic, group, log = cluster.create_topic(PARTITIONS, "close"), _uid("g"), []
    members = [Member(cluster, n, group, topic, log) for n in ("a", "b", "c")]
    try:
        _pump(members, _split(members, [2, 2, 2], topic), "a 2/2/2 split")
        _produce(cluster, topic, 3, "before")
        _pump(members, _read_once(members, 3 * PARTITIONS), "the first records")
        gone = members.pop()
        held, gone_id = frozenset(gone.owned), gone.consumer.group_metadata().member_id
        gone.consumer.close()  # revokes (commits), then leaves: no session to wait out
        assert log[-1] == ("revoked", "c", held)
        assert gone_id is not None and gone_id not in _members(cluster, group)
        _pump(members, _split(members, [3, 3], topic), "a 3/3 split of the rest")
        _produce(cluster, topic, 3, "after")
        _pump(members, _read_once([*members, gone], 6 * PARTITIONS), "every record")
        _assert_each_once([*members, gone], 6 * PARTITIONS)
        _assert_revoked_before_assigned(log)
        assert len(_members(cluster, group)) == 2
    finally:
        for member in members:
            member.consumer.close()


def _transform(producer: TransactionalProducer, consumer: Consumer, out: str,
               records: list[ConsumerRecord]) -> dict[TopicPartition, int]:
    """Write each record's output, and return the offsets that follow them."""
    for record in records:
        producer.send(out, f"{record.value}!", partition=record.partition)
    parts = {TopicPartition(r.topic, r.partition) for r in records}
    return {tp: consumer.position(tp) for tp in parts}


def test_consume_transform_produce_commits_with_the_member_s_metadata(cluster: Cluster) -> None:
    source, out, group = (cluster.create_topic(3, "in"), cluster.create_topic(3, "out"),
                          _uid("g"))  # fmt: skip
    _produce(cluster, source, 10, "v", partitions=3)
    producer = TransactionalProducer(cluster.url, _uid("ctp"))
    consumer = Consumer(cluster.url, group_id=group, max_poll_records=7)
    try:
        producer.init_transactions()
        consumer.subscribe(pattern=re.escape(source))
        done = 0
        deadline = time.monotonic() + 45
        while done < 30:
            assert time.monotonic() < deadline, f"only {done} of 30 transformed"
            records = consumer.poll(timeout=0.5)
            if not records:
                continue
            with producer.transaction():
                offsets = _transform(producer, consumer, out, records)
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            done += len(records)
        assert done == 30
        committed = consumer.committed()
        assert {tp.partition: om.offset for tp, om in committed.items() if om} == {
            0: 10, 1: 10, 2: 10}  # fmt: skip
        output = read_topic(cluster.url, out, 3, expect=30)
        assert sorted(str(r.value) for r in output) == sorted(
            f"v-{p}-{i}!" for p in range(3) for i in range(10))
    finally:
        consumer.close()
        producer.close()


def _assert_only_sentinels(cluster: Cluster, producer: TransactionalProducer, out: str,
                           partitions: int) -> None:
    """After the zombie's abort: a committed record behind it in every partition, read
    back, and nothing of the aborted output before it."""
    with producer.transaction():
        for p in range(partitions):
            producer.send(out, "sentinel", partition=p)
    output = read_topic(cluster.url, out, partitions, expect=partitions)
    assert [r.value for r in output] == ["sentinel"] * partitions


def _wait_gone(cluster: Cluster, group: str, member_id: str | None) -> None:
    deadline = time.monotonic() + 4 * SESSION_MS / 1000
    while member_id in _members(cluster, group):
        assert time.monotonic() < deadline, f"{member_id} was never removed"
        time.sleep(0.1)


@pytest.mark.parametrize("claimed_before_stall", [False, True])
def test_a_stalled_member_cannot_commit_and_its_output_stays_hidden(
    cluster: Cluster, claimed_before_stall: bool
) -> None:
    """The zombie: its heartbeats stop (as if the process were paused) past the session.
    Its transaction is refused at AddOffsetsToTxn, or, if it named the member before the
    stall, at the commit; aborted, its output is never seen. Its next poll reports the
    loss and it joins again."""
    source, out, group, log = (cluster.create_topic(2, "in"), cluster.create_topic(2, "out"),
                               _uid("g"), [])  # fmt: skip
    _produce(cluster, source, 5, "v", partitions=2)
    producer = TransactionalProducer(cluster.url, _uid("zombie"))
    member = Member(cluster, "z", group, source, log)
    try:
        producer.init_transactions()
        _pump([member], lambda: len(member.records) >= 10, "the input")
        metadata = member.consumer.group_metadata()
        producer.begin_transaction()
        offsets = _transform(producer, member.consumer, out, member.records)
        if claimed_before_stall:
            producer.send_offsets_to_transaction(offsets, metadata)
        member.consumer._heartbeat.stop()  # the stall
        _wait_gone(cluster, group, metadata.member_id)
        with pytest.raises(FENCED):
            if not claimed_before_stall:
                producer.send_offsets_to_transaction(offsets, member.consumer.group_metadata())
            producer.commit_transaction()
        assert producer.state is ProducerState.ABORTABLE_ERROR
        producer.abort_transaction()
        _assert_only_sentinels(cluster, producer, out, 2)
        assert member.consumer.committed() == dict.fromkeys(member.owned)
        owned = frozenset(member.owned)
        _pump([member], lambda: ("lost", "z", owned) in log and len(member.owned) == 2,
              "the loss noticed and the partitions back")
        assert member.consumer.group_metadata().member_id not in (None, metadata.member_id)
    finally:
        member.consumer.close()
        producer.close()


def test_async_members_share_rebalance_and_fence(cluster: Cluster) -> None:
    """Two async consumers with coroutine callbacks split a topic; a stalled one is
    refused at its commit, while the other takes all its partitions."""
    topic, out, group = (cluster.create_topic(PARTITIONS, "async"),
                         cluster.create_topic(PARTITIONS, "aout"), _uid("g"))  # fmt: skip
    _produce(cluster, topic, 3, "v")
    log: list[Event] = []

    def consumer(name: str) -> AsyncConsumer:
        made = AsyncConsumer(cluster.url, group_id=group)

        async def on_assigned(parts: set[TopicPartition]) -> None:
            await asyncio.sleep(0)
            log.append(("assigned", name, frozenset(parts)))

        async def on_revoked(parts: set[TopicPartition]) -> None:
            log.append(("revoked", name, frozenset(parts)))
            await made.commit({tp: await made.position(tp) for tp in parts})

        def on_lost(parts: set[TopicPartition]) -> None:  # a plain function does too
            log.append(("lost", name, frozenset(parts)))

        made.subscribe([topic], on_assigned=on_assigned, on_revoked=on_revoked,
                       on_lost=on_lost)  # fmt: skip
        return made

    async def pump(consumers: list[AsyncConsumer], until: Callable[[], bool], what: str,
                   got: list[ConsumerRecord]) -> None:
        deadline = time.monotonic() + 45
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for c in consumers:
                got.extend(await c.poll(timeout=0.1))

    async def main() -> None:
        a, b = consumer("a"), consumer("b")
        producer = AsyncTransactionalProducer(cluster.url, _uid("async-zombie"))
        got: list[ConsumerRecord] = []
        try:
            await producer.init_transactions()
            await pump([a, b], lambda: sorted(map(len, (a.assignment(), b.assignment())))
                       == [3, 3] and len(got) >= 3 * PARTITIONS, "a 3/3 split", got)
            assert not a.assignment() & b.assignment()
            assert Counter((r.partition, r.offset) for r in got).most_common(1)[0][1] == 1
            producer.begin_transaction()
            for tp in sorted(a.assignment()):
                await producer.send(out, "zombie output", partition=tp.partition)
            await producer.send_offsets_to_transaction(
                {tp: await a.position(tp) for tp in a.assignment()}, a.group_metadata())
            await a._heartbeat.stop()  # the stall
            await asyncio.to_thread(_wait_gone, cluster, group, a.group_metadata().member_id)
            with pytest.raises(FENCED):
                await producer.commit_transaction()
            assert producer.state is ProducerState.ABORTABLE_ERROR
            await producer.abort_transaction()
            async with producer.transaction():
                for p in range(PARTITIONS):
                    await producer.send(out, "sentinel", partition=p)
            await pump([b], lambda: len(b.assignment()) == PARTITIONS, "b takes all", got)
            held = frozenset(a.assignment())
            await a.close()  # its session is over: lost, not revoked (no stale commit)
            assert log[-1] == ("lost", "a", held)
        finally:
            await a.close()
            await b.close()
            await producer.close()

    asyncio.run(main())
    output = read_topic(cluster.url, out, PARTITIONS, expect=PARTITIONS)
    assert [r.value for r in output] == ["sentinel"] * PARTITIONS
    assert ("revoked", "a", frozenset()) not in log


def test_a_stalled_member_cannot_move_offsets_another_now_owns(cluster: Cluster) -> None:
    """Plain commits of a subscribed consumer go through the group's coordinator: after
    the zombie's session ran out, its commit is refused and the committed offsets stay
    where the new owner left them."""
    source, group, log = cluster.create_topic(2, "in"), _uid("g"), []
    _produce(cluster, source, 5, "v", partitions=2)
    zombie = Member(cluster, "z", group, source, log)
    try:
        _pump([zombie], lambda: len(zombie.records) >= 10, "the input")
        zombie.consumer.commit()  # a member's own commit goes through
        assert {o.offset for o in zombie.consumer.committed().values() if o} == {5}
        stale = zombie.consumer.group_metadata()
        zombie.consumer._heartbeat.stop()  # the stall
        _wait_gone(cluster, group, stale.member_id)
        other = Member(cluster, "o", group, source, log)
        try:
            _pump([other], lambda: len(other.owned) == 2, "the partitions moved")
            other.consumer.commit({tp: 3 for tp in other.owned})
            with pytest.raises(FENCED):
                zombie.consumer.commit({tp: 5 for tp in other.owned})
            assert {o.offset for o in other.consumer.committed().values() if o} == {3}
        finally:
            other.consumer.close()
    finally:
        zombie.consumer.close()
