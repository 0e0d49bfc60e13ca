"""The producer's multi-partition produce, without a server: how the drained batches are
grouped into requests (``ProducerCore.requests_for``) and how one answer settles each
batch on its own (``sdk._txn_calls.produce_many``), driven step by step as the twins
drive it."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from eos_protocol.errors import NotFoundError, ProducerFencedError
from sdk import _txn_calls as calls
from sdk._config import ProducerConfig
from sdk._producer_base import ProducerCore
from sdk._transport import UNKNOWN_OUTCOME
from sdk._txn_calls import Produce
from tests.sdk.test_txn_calls import Driver

pytestmark = pytest.mark.unit

A, B = "http://a", "http://b"
#: Partitions 0, 1 and 3 led by node A, 2 by node B.
TOPIC = {"name": "t", "partitions": [
    {"partition": p, "leader": {"node_id": 1 if url == A else 2, "url": url + "/"}}
    for p, url in enumerate([A, A, B, A])
]}  # fmt: skip


def idempotent_core(drive: Driver) -> ProducerCore:
    core = ProducerCore(ProducerConfig("http://c", linger_ms=0), batch_future=Future)
    core.on_producer_id({"producer_id": 7, "producer_epoch": 0})
    drive.run(calls.fetch_topic(core, "t"), TOPIC)
    return core


def one_record_each(core: ProducerCore, partitions: list[int]) -> dict[int, Future[Any]]:
    futures: dict[int, Future[Any]] = {}
    for p in partitions:
        futures[p] = Future()
        assert core.try_append("t", f"v{p}", None, p, None, None, futures[p]) is not None
    return futures


def test_batches_are_grouped_by_leader_node() -> None:
    drive = Driver()
    core = idempotent_core(drive)
    one_record_each(core, [0, 1, 2, 3])
    requests = core.next_actions().requests
    grouped = {url: sorted(b.tp.partition for b in batches) for url, batches in requests}
    # Node A's three batches go in one request; node B's only batch goes alone.
    assert grouped == {A: [0, 1, 3], None: [2]}


def test_each_batch_is_settled_by_its_own_entry() -> None:
    drive = Driver()
    core = idempotent_core(drive)
    futures = one_record_each(core, [0, 1, 3])
    ((url, batches),) = core.next_actions().requests
    assert url == A
    answer = {"batches": [
        {"topic": "t", "partition": 0, "base_offset": 5, "last_offset": 5,
         "duplicate": False, "log_append_time_ms": 1, "error": None},
        {"topic": "t", "partition": 1, "error": {
            "code": "NOT_LEADER_OR_FOLLOWER", "message": "moved", "retriable": True}},
        {"topic": "t", "partition": 3, "base_offset": 9, "last_offset": 9,
         "duplicate": False, "log_append_time_ms": 1, "error": None},
    ]}  # fmt: skip
    drive.run(calls.produce_many(core, A, batches), answer)
    (step,) = drive.asked
    assert isinstance(step, Produce) and step.url == A + "/v1/produce"
    assert [(b["partition"], b["base_sequence"]) for b in step.body["batches"]] == [
        (0, 0), (1, 0), (3, 0)
    ]
    assert futures[0].result(0).offset == 5 and futures[3].result(0).offset == 9
    # The refused batch waits for a retry, its leader to be looked up again; no other.
    assert not futures[1].done()
    assert [b.tp.partition for b in core.accumulator.queues[batches[1].tp].retries] == [1]
    assert core.metadata.leader(batches[0].tp) is None  # the topic is looked up again


def test_a_fatal_entry_fails_only_its_batch() -> None:
    drive = Driver()
    core = idempotent_core(drive)
    futures = one_record_each(core, [0, 1])
    ((_, batches),) = core.next_actions().requests
    answer = {"batches": [
        {"topic": "t", "partition": 0, "error": {
            "code": "PRODUCER_FENCED", "message": "newer epoch", "retriable": False}},
        {"topic": "t", "partition": 1, "base_offset": 0, "last_offset": 0,
         "duplicate": False, "log_append_time_ms": 1, "error": None},
    ]}  # fmt: skip
    drive.run(calls.produce_many(core, A, batches), answer)
    with pytest.raises(ProducerFencedError):
        futures[0].result(0)
    assert futures[1].result(0).offset == 0


def test_a_lost_answer_retries_every_batch() -> None:
    drive = Driver()
    core = idempotent_core(drive)
    futures = one_record_each(core, [0, 1])
    ((_, batches),) = core.next_actions().requests
    drive.run(calls.produce_many(core, A, batches), UNKNOWN_OUTCOME[0]("reset"))
    assert not any(f.done() for f in futures.values())
    for batch in batches:
        assert core.accumulator.queues[batch.tp].retries == [batch]
        assert batch.base_sequence == 0  # the retry keeps its sequence: a duplicate at most


def test_a_node_without_the_path_is_sent_one_batch_per_request() -> None:
    drive = Driver()
    core = idempotent_core(drive)
    futures = one_record_each(core, [0, 1])
    ((_, batches),) = core.next_actions().requests
    ack = {"base_offset": 0, "last_offset": 0, "duplicate": False, "log_append_time_ms": 1}
    drive.run(calls.produce_many(core, A, batches), NotFoundError("Not Found"), ack, ack)
    assert [s.url for s in drive.asked if isinstance(s, Produce)] == [
        A + "/v1/produce", A + "/v1/partitions/t/0/records", A + "/v1/partitions/t/1/records"
    ]
    assert all(f.result(0).offset == 0 for f in futures.values())
    # Later batches to that node go one per request too.
    one_record_each(core, [0, 1])
    assert [url for url, _ in core.next_actions().requests] == [None, None]
