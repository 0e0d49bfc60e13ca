"""The consumer group member's state machine (``sdk._group_base``), with no server.

The member is driven as the heartbeat driver and poll drive it: ``begin_heartbeat`` gives
the body to send, the answer (or an error) goes back in, ``reconcile`` tells poll what to
let go of and take on, ``released``/``acquired`` report that it was done. A fake clock
moves time. The last tests run each heartbeat driver (the async task and the blocking
thread) against a coordinator in memory behind ``httpx.MockTransport``, to show that a
heartbeat follows NOT_COORDINATOR to the owner the answer names, as transactional calls do.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import Future
from typing import Any

import httpx
import orjson
import pytest

from sdk import (
    ConsumerGroupMetadata,
    CoordinatorNotAvailableError,
    FencedMemberEpochError,
    IllegalStateError,
    NotCoordinatorError,
    TopicPartition,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from sdk._config import USE_DEFAULT, ConsumerConfig, ProducerConfig, RetryConfig
from sdk._consumer_base import ConsumerCore
from sdk._errors import EosTimeoutError
from sdk._group_base import Beat, GroupMember, MemberState, Rebalance
from sdk._heartbeat import AsyncHeartbeat, Heartbeat
from sdk._metadata import MetadataCache
from sdk._producer_base import ProducerCore
from sdk._state import ProducerState
from sdk._transport import Req
from sdk._txn_calls import Call, add_offsets_body, send_offsets_to_transaction

pytestmark = pytest.mark.unit

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
RETRY = RetryConfig(backoff_ms=100, backoff_max_ms=1_000)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(member_id: str = "m1", epoch: int = 1, parts: tuple[TopicPartition, ...] = (),
           interval_ms: int = 1_000, session_ms: int = 10_000) -> dict[str, Any]:
    return {
        "member_id": member_id, "member_epoch": epoch, "heartbeat_interval_ms": interval_ms,
        "session_timeout_ms": session_ms,
        "assignment": [{"topic": tp.topic, "partition": tp.partition} for tp in parts],
    }  # fmt: skip


def wire(*parts: TopicPartition) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in parts]


def member(clock: Clock, **kwargs: Any) -> GroupMember:
    return GroupMember("g", RETRY, clock=clock, **kwargs)


def beat(m: GroupMember) -> Beat:
    assert m.next_heartbeat() == 0, "a heartbeat should be due now"
    sent = m.begin_heartbeat()
    assert sent is not None
    return sent


def joined(clock: Clock, *parts: TopicPartition, **kwargs: Any) -> GroupMember:
    """A member that joined, was given ``parts`` and took them on in a poll."""
    m = member(clock, **kwargs)
    m.subscribe(["t"], None)
    m.on_answer(beat(m), answer(parts=parts))
    plan = m.reconcile()
    assert plan == Rebalance(assigned=frozenset(parts))
    m.acquired(plan.assigned)
    return m


def test_a_join_names_the_subscription_and_owns_nothing() -> None:
    m = member(Clock(), rebalance_timeout_ms=20_000)
    assert m.next_heartbeat() is None  # not subscribed: nothing to send
    m.subscribe(["t", "u", "t"], None)
    sent = beat(m)
    member_id = sent.body.pop("member_id")
    assert re.fullmatch(r"[0-9a-f]{32}", member_id)  # its own: a repeated join is the same
    assert sent.body == {"member_epoch": 0, "subscribed_topic_names": ["t", "u"],
                         "owned_partitions": [], "rebalance_timeout_ms": 20_000,
                         "max_wait_ms": 0}  # fmt: skip
    assert beat(m).body["member_id"] == member_id  # the join again, its answer lost


def test_a_static_member_joins_with_its_instance_id_and_a_pattern() -> None:
    m = member(Clock(), instance_id="copy-1")
    m.subscribe(None, r"orders\..*")
    body = beat(m).body
    assert body.pop("member_id")
    assert body == {"member_epoch": 0, "instance_id": "copy-1",
                    "subscribed_topic_regex": r"orders\..*", "owned_partitions": [],
                    "max_wait_ms": 0}  # fmt: skip


@pytest.mark.parametrize(("topics", "pattern"), [
    (None, None), (["t"], "t.*"), ([], None), (None, "("), (["bad name/"], None),
])  # fmt: skip
def test_a_subscription_is_topics_or_a_valid_pattern(
    topics: list[str] | None, pattern: str | None
) -> None:
    with pytest.raises(ValueError):
        member(Clock()).subscribe(topics, pattern)


def test_join_assign_revoke_acknowledge() -> None:
    """The whole flow: join, the assignment taken on in a poll, a long poll in step, a
    revocation answered by an acknowledgement at once (not at the next interval)."""
    clock = Clock()
    m = joined(clock, T0, T1)
    assert m.group_metadata() == ConsumerGroupMetadata("g", "m1", 1)
    sent = beat(m)  # in step with the assignment: a long poll at once
    assert sent.body == {"member_id": "m1", "member_epoch": 1,
                         "owned_partitions": wire(T0, T1), "max_wait_ms": 1_000}  # fmt: skip
    clock.now += 0.4
    assert m.on_answer(sent, answer(epoch=2, parts=(T0,))) is True  # poll has work
    # the application has not polled yet: no heartbeat until the interval is over
    assert m.next_heartbeat() == pytest.approx(0.6)
    clock.now += 0.6
    still = beat(m)
    assert still.body["owned_partitions"] == wire(T0, T1)
    assert still.body["max_wait_ms"] == 0  # out of step: nothing to hold it for
    m.on_answer(still, answer(epoch=2, parts=(T0,)))
    plan = m.reconcile()
    assert plan == Rebalance(revoked=frozenset({T1}))
    assert m.group_metadata().member_epoch == 2
    m.released(plan.revoked)
    ack = beat(m)  # at once: the revocation is acknowledged
    assert ack.body["owned_partitions"] == wire(T0)
    m.on_answer(ack, answer(epoch=2, parts=(T0,)))
    assert not m.reconcile()


def test_new_partitions_after_a_revocation_are_assigned() -> None:
    clock = Clock()
    m = joined(clock, T0)
    m.on_answer(beat(m), answer(epoch=3, parts=(T0, T2)))
    plan = m.reconcile()
    assert plan == Rebalance(assigned=frozenset({T2}))
    m.acquired(plan.assigned)
    assert beat(m).body["owned_partitions"] == wire(T0, T2)


def test_an_early_answer_with_nothing_new_waits_for_the_interval() -> None:
    """A long poll the coordinator did not hold must not turn into a busy loop."""
    clock = Clock()
    m = joined(clock, T0)
    held = beat(m)
    clock.now += 1.0
    m.on_answer(held, answer(parts=(T0,)))  # held the whole wait: the next one at once
    quick = beat(m)
    clock.now += 0.01
    m.on_answer(quick, answer(parts=(T0,)))
    assert m.next_heartbeat() == pytest.approx(0.99)


def test_a_lost_answer_is_retried_at_the_same_epoch_and_the_session_bounds_it() -> None:
    """A heartbeat without an answer is sent again with the epoch it had (the coordinator
    takes the previous epoch from a member whose answer was lost); only once no answer
    came for a whole session is the member lost."""
    clock = Clock()
    m = joined(clock, T0)
    sent = beat(m)
    clock.now += 3.0
    assert m.on_error(sent, EosTimeoutError("no answer")) is False
    delay = m.next_heartbeat()
    assert delay is not None and 0 < delay <= 0.2  # a backoff
    clock.now += delay
    again = beat(m)
    assert (again.body["member_id"], again.body["member_epoch"]) == ("m1", 1)
    assert m.on_error(again, CoordinatorNotAvailableError()) is False
    assert m.state is MemberState.STABLE
    clock.now += 8.0  # 11 s since the last answer, the session is 10 s
    assert m.has_work()
    assert m.reconcile() == Rebalance(lost=frozenset({T0}))


@pytest.mark.parametrize("error", [FencedMemberEpochError(), UnknownMemberIdError()])
def test_fenced_member_loses_everything_then_joins_again(error: Exception) -> None:
    clock = Clock()
    m = joined(clock, T0, T1)
    assert m.on_error(beat(m), error) is True
    assert m.next_heartbeat() is None  # no join before poll dropped everything
    assert m.begin_heartbeat() is None
    plan = m.reconcile()
    assert plan == Rebalance(lost=frozenset({T0, T1}))
    # the records already returned were read under the old membership: it stays the one
    # a transaction names, so their offsets are refused
    assert m.group_metadata() == ConsumerGroupMetadata("g", "m1", 1)
    m.released(plan.lost)
    assert m.group_metadata() == ConsumerGroupMetadata("g")
    rejoin = beat(m)
    assert rejoin.body.pop("member_id") not in (None, "m1")  # a fresh member
    assert rejoin.body == {"member_epoch": 0, "subscribed_topic_names": ["t"],
                           "owned_partitions": [], "max_wait_ms": 0}  # fmt: skip
    m.on_answer(rejoin, answer(member_id="m2", epoch=5, parts=(T1,)))
    assert m.reconcile() == Rebalance(assigned=frozenset({T1}))
    assert m.group_metadata() == ConsumerGroupMetadata("g", "m2", 5)


def test_answers_to_an_older_membership_are_ignored() -> None:
    clock = Clock()
    m = joined(clock, T0)
    in_flight = beat(m)
    m.on_error(beat(m), FencedMemberEpochError())
    assert m.on_answer(in_flight, answer(epoch=9, parts=(T0, T1))) is False
    assert m.reconcile() == Rebalance(lost=frozenset({T0}))


def test_a_fenced_member_with_nothing_joins_again_at_once() -> None:
    m = joined(Clock())
    m.on_error(beat(m), UnknownMemberIdError())
    assert beat(m).body["member_epoch"] == 0


def test_a_fenced_static_member_joins_again_under_its_id() -> None:
    clock = Clock()
    m = joined(clock, T0, instance_id="copy-1")
    m.on_error(beat(m), FencedMemberEpochError())
    m.released(m.reconcile().lost)
    body = beat(m).body
    assert (body["member_id"], body["member_epoch"], body["instance_id"]) == ("m1", 0, "copy-1")


def test_a_refusal_reaches_poll_and_the_join_is_tried_again() -> None:
    clock = Clock()
    m = member(clock)
    m.subscribe(["missing"], None)
    refusal = UnknownTopicOrPartitionError("no topic missing")
    assert m.on_error(beat(m), refusal) is True
    assert m.has_work()
    assert m.take_error() is refusal
    assert m.take_error() is None
    assert m.next_heartbeat() == pytest.approx(1.0)  # backoff_max_ms
    clock.now += 1.0
    assert beat(m).body["member_epoch"] == 0


def test_a_new_subscription_goes_with_the_next_heartbeat() -> None:
    clock = Clock()
    m = joined(clock, T0)
    m.subscribe(None, "t|u")
    sent = beat(m)
    assert sent.body["subscribed_topic_regex"] == "t|u"
    assert sent.body["max_wait_ms"] == 0
    m.on_answer(sent, answer(parts=(T0,)))
    assert "subscribed_topic_regex" not in beat(m).body


@pytest.mark.parametrize(("instance_id", "epoch"), [(None, -1), ("copy-1", -2)])
def test_leave_body_and_after(instance_id: str | None, epoch: int) -> None:
    clock = Clock()
    m = joined(clock, T0, instance_id=instance_id)
    in_flight = beat(m)
    assert m.release_all() == Rebalance(revoked=frozenset({T0}))
    assert m.leave() == {"member_id": "m1", "member_epoch": epoch}
    assert not m.subscribed
    assert m.next_heartbeat() is None
    assert m.on_answer(in_flight, answer(parts=(T0,))) is False
    assert m.group_metadata() == ConsumerGroupMetadata("g", instance_id=instance_id)
    m.subscribe(["t"], None)  # a new membership
    assert beat(m).body["member_epoch"] == 0


def test_a_fenced_or_joining_member_has_nothing_to_leave() -> None:
    m = member(Clock())
    m.subscribe(["t"], None)
    assert m.leave() is None
    fenced = joined(Clock(), T0)
    fenced.on_error(beat(fenced), FencedMemberEpochError())
    assert fenced.release_all() == Rebalance(lost=frozenset({T0}))
    assert fenced.leave() is None


def test_the_long_poll_stays_inside_the_session() -> None:
    clock = Clock()
    m = member(clock)
    m.subscribe(["t"], None)
    m.on_answer(beat(m), answer(interval_ms=30_000, session_ms=20_000))
    assert beat(m).body["max_wait_ms"] == 10_000


def test_assign_and_subscribe_exclude_each_other() -> None:
    core = ConsumerCore(ConsumerConfig("http://c", group_id="g"))
    core.assign([T0])
    with pytest.raises(IllegalStateError, match="exclude each other"):
        core.check_can_subscribe()
    core.assign([])
    core.check_can_subscribe()
    core.subscribed = True
    with pytest.raises(IllegalStateError, match="exclude each other"):
        core.assign([T0])
    with pytest.raises(IllegalStateError, match="group_id"):
        ConsumerCore(ConsumerConfig("http://c")).check_can_subscribe()


def _in_transaction() -> ProducerCore:
    core = ProducerCore(ProducerConfig("http://c", transactional_id="x"), batch_future=Future)
    core.txn.begin_init()
    core.txn.complete_init(7, 0)
    core.txn.begin_transaction()
    return core


def test_add_offsets_names_the_member_and_its_partitions() -> None:
    core = _in_transaction()
    ids = {"producer_id": 7, "producer_epoch": 0}
    assert add_offsets_body(core, "g", [T0]) == {**ids, "group_id": "g"}
    meta = ConsumerGroupMetadata("g", "m1", 4)
    assert add_offsets_body(core, meta, [T1, T0, T1]) == {
        **ids, "group_id": "g", "member_id": "m1", "member_epoch": 4,
        "partitions": wire(T0, T1),
    }  # fmt: skip
    # no member (joining, or fenced): nothing claimed; a group with members refuses it
    assert add_offsets_body(core, ConsumerGroupMetadata("g"), [T0]) == {**ids, "group_id": "g"}


@pytest.mark.parametrize("error", [FencedMemberEpochError(), UnknownMemberIdError()])
def test_a_fenced_member_makes_the_transaction_abortable(error: Exception) -> None:
    core = _in_transaction()
    steps = send_offsets_to_transaction(
        core, {T0: 5}, ConsumerGroupMetadata("g", "m1", 4), USE_DEFAULT
    )
    call = steps.send(None)
    assert isinstance(call, Call) and call.req is Req.ADD_OFFSETS
    assert call.body == {"producer_id": 7, "producer_epoch": 0, "group_id": "g",
                         "member_id": "m1", "member_epoch": 4, "partitions": wire(T0)}
    with pytest.raises(type(error)):
        steps.throw(error)
    assert core.state is ProducerState.ABORTABLE_ERROR
    core.begin_abort()  # abort_transaction may go on
    assert core.state is ProducerState.ABORTING_TRANSACTION


# --- the drivers, against a coordinator in memory ----------------------------------------


class FakeCoordinator:
    """Two coordinator instances: ``a`` says ``b`` owns every group; ``b`` answers
    heartbeats with the whole topic ``t`` for the one member."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = orjson.loads(request.content) if request.content else {}
        if request.url.path == "/v1/coordinators":
            assert request.url.params["key_type"] == "consumer_group"
            return httpx.Response(200, json={"key": "g", "key_type": "consumer_group",
                                             "node_id": 0, "url": "http://a"})  # fmt: skip
        if request.url.path == "/v1/metadata":
            return httpx.Response(200, json={"topics": [], "coordinators": []})
        assert request.url.path == "/v1/groups/g/heartbeat"
        self.seen.append((host, body))
        if host == "a":
            error = NotCoordinatorError("not here", details={"coordinator_url": "http://b/"})
            return httpx.Response(503, json=error.envelope())
        return httpx.Response(200, json=answer(parts=(T0, T1), interval_ms=100))


def _wait(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_blocking_driver_follows_not_coordinator() -> None:
    fake = FakeCoordinator()
    config = ConsumerConfig("http://a", group_id="g", retry=RETRY)
    m = GroupMember("g", RETRY)
    driver = Heartbeat(m, MetadataCache("http://a"), config, httpx.MockTransport(fake.handle))
    m.subscribe(["t"], None)
    driver.start()
    try:
        _wait(lambda: m.state is MemberState.STABLE)
        driver.wait_changed(5.0)
        assert m.reconcile() == Rebalance(assigned=frozenset({T0, T1}))
    finally:
        driver.close()
    assert [host for host, _ in fake.seen[:2]] == ["a", "b"]
    with pytest.raises(TypeError, match="AsyncConsumer"):
        driver.check_callback(_async_callback)


async def _async_callback(parts: set[TopicPartition]) -> None:
    return None


def test_the_async_driver_follows_not_coordinator_and_awaits_callbacks() -> None:
    fake = FakeCoordinator()
    config = ConsumerConfig("http://a", group_id="g", retry=RETRY)
    m = GroupMember("g", RETRY)
    got: list[set[TopicPartition]] = []

    async def on_assigned(parts: set[TopicPartition]) -> None:
        await asyncio.sleep(0)
        got.append(parts)

    async def main() -> None:
        transport = httpx.MockTransport(fake.handle)
        driver = AsyncHeartbeat(m, MetadataCache("http://a"), config, transport)
        m.subscribe(["t"], None)
        driver.start()
        try:
            await driver.wait_changed(5.0)
            plan = m.reconcile()
            await driver.invoke(on_assigned, set(plan.assigned))
            await driver.invoke(got.append, {T2})
        finally:
            await driver.leave()
            await driver.aclose()

    asyncio.run(main())
    assert got == [{T0, T1}, {T2}]
    assert [host for host, _ in fake.seen[:2]] == ["a", "b"]
    assert fake.seen[-1] == ("b", {"member_id": "m1", "member_epoch": -1})
