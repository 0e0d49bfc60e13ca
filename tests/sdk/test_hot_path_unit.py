"""The pure logic of the SDK's fast paths, without a server: the futures of a
``send_many`` list, the shared-condition future of ``send``, a list appended at once
(same partitions and order as record by record), closed batches sent together, and the
consumer's buffer of fetched records and its fetches ahead."""

from __future__ import annotations

import random
import threading
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures import wait as wait_futures
from typing import Any

import pytest

from sdk import ConsumerRecord, KafkaStorageError, RecordMetadata, TopicPartition
from sdk._accumulator import Partitioner, ProducerBatch, RecordAccumulator
from sdk._config import ConsumerConfig, ProducerConfig
from sdk._consumer_base import FETCH_AHEAD, ConsumerCore
from sdk._prefetch import Prefetcher
from sdk._producer_base import ProducerCore
from sdk._record_futures import RecordFuture, RecordFutures, Segment, acked, failed

pytestmark = pytest.mark.unit

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


# --- the futures of a list ---------------------------------------------------------------


def test_record_futures_are_made_on_demand_and_settled_by_range() -> None:
    futures = RecordFutures(5)
    early = futures[1]  # asked for before its batch is acknowledged
    assert not early.done() and not futures.all_done.done()
    futures.settle(0, 3, acked(0, 3, "t", 0, 100, 7, False))
    assert early.result(0) == RecordMetadata("t", 0, 101, 7, False)
    assert futures[2].result(0).offset == 102  # made after: done at once
    assert not futures.all_done.done()
    futures.settle(3, 5, acked(3, 5, "t", 1, 40, 8, True))
    assert futures.all_done.done()
    assert [m.offset for m in futures.results(0)] == [100, 101, 102, 40, 41]
    assert futures[-1].result(0) == RecordMetadata("t", 1, 41, 8, True)
    assert [f.result(0).partition for f in futures[3:]] == [1, 1]
    assert futures[1] is early  # one future per record, however often asked for
    with pytest.raises(IndexError):
        futures[5]


def test_a_failed_range_fails_its_records_and_results() -> None:
    futures = RecordFutures(4)
    waiting = futures[3]
    futures.settle(0, 2, acked(0, 2, "t", 0, 0, 1, False))
    futures.settle(2, 4, failed(2, 4, KafkaStorageError("disk")))
    assert isinstance(waiting.exception(0), KafkaStorageError)
    assert futures[0].result(0).offset == 0
    with pytest.raises(KafkaStorageError):
        futures.results(0)


def test_results_time_out_while_records_are_pending() -> None:
    futures = RecordFutures(2)
    with pytest.raises(FutureTimeoutError):
        futures.results(0.01)
    assert RecordFutures(0).results(0) == []


def test_record_future_shares_a_condition_and_still_waits_for_itself() -> None:
    condition = threading.Condition()
    first: RecordFuture[int] = RecordFuture(condition)
    second: RecordFuture[int] = RecordFuture(condition)
    assert isinstance(first, Future)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(second.result(30)))
    waiter.start()
    first.set_result(1)  # wakes the waiter of ``second``, which must go on waiting
    assert first.result(0) == 1 and not got
    second.set_result(2)
    waiter.join()
    assert got == [2]
    third: RecordFuture[int] = RecordFuture(condition)
    with pytest.raises(FutureTimeoutError):
        third.result(0.01)
    done, _ = wait_futures([third, first], timeout=1, return_when=FIRST_COMPLETED)
    assert done == {first}
    calls: list[Any] = []
    third.add_done_callback(calls.append)
    third.set_exception(KafkaStorageError("disk"))
    assert calls == [third] and isinstance(third.exception(0), KafkaStorageError)


# --- the accumulator ---------------------------------------------------------------------


def accumulator(**overrides: Any) -> RecordAccumulator:
    options: dict[str, Any] = dict(
        batch_size=1000, linger_ms=10, max_in_flight=5, delivery_timeout_ms=10_000,
        backoff=lambda exc, attempt: 0.1, batch_future=Future,
    )
    options.update(overrides)
    return RecordAccumulator(**options)


def drain(acc: RecordAccumulator, now: int = 100, limit: int | None = None) -> list[ProducerBatch]:
    batches, _ = acc.drain(now, lambda tp, most: most if limit is None else limit, 1, 0)
    for batch in batches:
        batch.on_wire = True
    return batches


def test_a_list_enters_each_batch_as_one_segment_and_settles_in_order() -> None:
    acc = accumulator()
    single: Future[RecordMetadata] = Future()
    acc.append(TP0, None, "first", None, None, single, 0)
    futures = RecordFutures(12)
    end, opened = acc.extend(TP0, None, ["x" * 100] * 12, None, None, futures, 0, 0,
                             until_new_batch=False)
    assert (end, opened) == (12, True)
    batches = list(acc.queues[TP0].unsent)
    assert [len(b.records) for b in batches] == [7, 6]  # 140-byte records in 1000
    assert isinstance(batches[0].futures[1], Segment) and len(batches[0].futures[1]) == 6
    first = drain(acc)[0]
    acc.complete(first, {"base_offset": 50, "log_append_time_ms": 3})
    assert single.result(0).offset == 50
    assert [futures[i].result(0).offset for i in range(6)] == list(range(51, 57))
    assert not futures[6].done()


def test_until_new_batch_stops_after_the_record_that_opened_one() -> None:
    acc = accumulator()
    futures = RecordFutures(20)
    end, opened = acc.extend(TP0, None, ["x" * 100] * 20, None, None, futures, 0, 0,
                             until_new_batch=True)
    assert (end, opened) == (1, True)  # the first record opened the partition's batch
    end, opened = acc.extend(TP0, None, ["x" * 100] * 20, None, None, futures, 1, 0,
                             until_new_batch=True)
    assert (end, opened) == (8, True)  # 6 more fill it, the 8th opens the next


def test_a_lone_first_batch_takes_closed_ones_along_within_the_limit() -> None:
    acc = accumulator(max_request_bytes=2500)
    singles: list[Future[RecordMetadata]] = [Future() for _ in range(40)]
    for future in singles:
        acc.append(TP0, None, "x" * 100, None, None, future, 0)
    queued = list(acc.queues[TP0].unsent)
    assert [len(b.records) for b in queued] == [7, 7, 7, 7, 7, 5]
    first = drain(acc, limit=1)[0]  # it goes alone (a transaction's first batch)
    assert len(first.records) == 14  # two closed batches: a third would pass 2500 bytes
    assert first.absorbed == [queued[1].done]
    pending = [b.done for b in queued]
    acc.complete(first, {"base_offset": 0, "log_append_time_ms": 1})
    assert [f.result(0).offset for f in singles[:14]] == list(range(14))
    assert pending[0].done() and pending[1].done() and not pending[2].done()


def test_batches_go_one_by_one_when_the_window_is_open_or_there_is_no_limit() -> None:
    acc = accumulator(max_request_bytes=10**6)
    for _ in range(20):
        acc.append(TP0, None, "x" * 100, None, None, Future(), 0)
    assert len(drain(acc)[0].records) == 7
    acc = accumulator()
    for _ in range(20):
        acc.append(TP0, None, "x" * 100, None, None, Future(), 0)
    assert len(drain(acc, limit=1)[0].records) == 7


def test_what_a_lone_batch_takes_along_is_what_the_window_would_carry() -> None:
    acc = accumulator(max_request_bytes=10**6, max_in_flight=3)
    for _ in range(70):
        acc.append(TP0, None, "x" * 100, None, None, Future(), 0)
    assert len(drain(acc, limit=1)[0].records) == 21  # three batches' worth


def test_the_open_batch_is_not_taken_along() -> None:
    acc = accumulator(max_request_bytes=10**6, linger_ms=0)
    for _ in range(10):  # one closed batch of 7, one open one of 3
        acc.append(TP0, None, "x" * 100, None, None, Future(), 0)
    assert [len(b.records) for b in drain(acc, limit=1)] == [7]


# --- a list appended at once -------------------------------------------------------------


def core_with_topic(partitions: int = 3, seed: int = 1) -> ProducerCore:
    core = ProducerCore(ProducerConfig("http://c", batch_size=600), batch_future=Future)
    core.partitioner = Partitioner(random.Random(seed))
    core.metadata.update_topic({"name": "t", "partitions": [
        {"partition": p, "leader": {"node_id": 1, "url": "http://n"}} for p in range(partitions)]})
    return core


def queued(core: ProducerCore) -> dict[int, list[Any]]:
    return {
        tp.partition: [r["value"] for b in q.unsent for r in b.records]
        for tp, q in sorted(core.accumulator.queues.items())
    }


@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "keyed"])
def test_a_list_lands_where_records_sent_one_by_one_would(keyed: bool) -> None:
    values = [f"v{i}" * 20 for i in range(50)]
    keys = [f"k{i % 7}" for i in range(50)] if keyed else None
    one_by_one, at_once = core_with_topic(), core_with_topic()
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        one_by_one.try_append("t", value, key, None, None, None, Future())
    at_once.append_many("t", values, keys, None, None, None, RecordFutures(50))
    assert queued(at_once) == queued(one_by_one)
    assert len(queued(at_once)) > 1  # the records did spread


def test_a_refused_list_queues_nothing() -> None:
    core = core_with_topic()
    with pytest.raises(TypeError):
        core.append_many("t", ["a", 3, "c"], None, None, None, None, RecordFutures(3))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 keys for 3 values"):
        core.append_many("t", ["a", "b", "c"], ["k", "k"], None, None, None, RecordFutures(3))
    assert queued(core) == {}
    assert not core.append_many("unknown", ["a"], None, None, None, None, RecordFutures(1))


def test_a_list_to_one_partition_keeps_its_order() -> None:
    core = core_with_topic()
    values = [f"r{i:03d}" for i in range(100)]
    core.append_many("t", values, None, 2, None, None, RecordFutures(100))
    assert queued(core) == {2: values}


# --- the consumer's buffer ---------------------------------------------------------------


def answer(offsets: list[int], next_offset: int, lso: int) -> dict[str, Any]:
    return {
        "records": [{"offset": o, "key": None, "value": f"v{o}", "headers": {},
                     "timestamp_ms": 1, "encoding": "utf8"} for o in offsets],
        "next_offset": next_offset, "high_watermark": lso, "last_stable_offset": lso,
        "log_start_offset": 0,
    }


def consumer_core(max_poll: int = 3) -> ConsumerCore:
    core = ConsumerCore(ConsumerConfig("http://c", max_poll_records=max_poll))
    core.assign([TP0])
    core.seek(TP0, 10)
    return core


def test_records_are_handed_out_a_poll_at_a_time_and_positions_follow() -> None:
    core = consumer_core()
    assert core.on_fetch(TP0, 10, answer([10, 11, 13, 14], 16, 30))  # 12: aborted
    assert not core.on_fetch(TP0, 16, answer([16], 17, 30))  # the buffer is not empty
    first = core.take(TP0, 3)
    assert [r.offset for r in first] == [10, 11, 13]
    assert isinstance(first[0], ConsumerRecord) and first[0].value == "v10"
    assert core.known_position(TP0) == 14 and core.fetch_offset(TP0) == 16
    assert [r.offset for r in core.take(TP0, 3)] == [14]
    assert core.known_position(TP0) == 16  # past the answer's gap, not 15
    assert not core.has_buffered(TP0) and core.take(TP0, 3) == []


def test_a_seek_drops_the_buffer_and_answers_for_the_old_offset() -> None:
    core = consumer_core()
    core.on_fetch(TP0, 10, answer([10, 11, 12, 13], 14, 30))
    core.take(TP0, 1)
    core.seek(TP0, 5)
    assert not core.has_buffered(TP0) and core.fetch_offset(TP0) == 5
    assert not core.on_fetch(TP0, 14, answer([14], 15, 30))  # fetched ahead from 14
    assert core.known_position(TP0) == 5
    assert core.on_fetch(TP0, 5, answer([], 9, 30))  # only a gap: the position moves on
    assert core.known_position(TP0) == 9


def test_fetches_ahead_follow_the_last_stride_up_to_the_stable_offset() -> None:
    core = consumer_core()
    assert core.ahead_offset(TP0, 0, None) is None  # nothing known of the log yet
    core.on_fetch(TP0, 10, answer([10, 11, 12, 13, 14], 15, 24))
    assert core.ahead_offset(TP0, 0, None) == 15
    assert core.ahead_offset(TP0, 1, 15) == 20  # 15 plus the last stride of 5
    assert core.ahead_offset(TP0, 2, 20) is None if FETCH_AHEAD == 2 else True
    assert core.ahead_offset(TP0, 1, 20) is None  # 25 is past the LSO of 24
    core.assign([TP1])
    assert core.ahead_offset(TP0, 0, None) is None


def test_the_prefetcher_uses_a_fetch_only_for_its_offset() -> None:
    ahead: Prefetcher[str] = Prefetcher()
    try:
        ahead.start(TP0, 10, lambda: "from 10")
        ahead.start(TP0, 15, lambda: "from 15")
        ahead.start(TP1, 3, lambda: "p1")
        assert ahead.count(TP0) == 2 and ahead.last_offset(TP0) == 15
        handle = ahead.take(TP0, 10)
        assert handle is not None and ahead.wait(handle) == "from 10"
        assert ahead.take(TP0, 12) is None  # nothing from 12; 10 is gone, 15 stays
        assert ahead.count(TP0) == 1
        assert ahead.take(TP0, 16) is None and ahead.count(TP0) == 0  # 15 is behind now
        ahead.forget([TP0])
        assert ahead.count(TP1) == 0
        ahead.start(TP0, 1, lambda: (_ for _ in ()).throw(KafkaStorageError("disk")))
        failed_handle = ahead.take(TP0, 1)
        assert failed_handle is not None and ahead.wait(failed_handle) is None
    finally:
        ahead.close()
