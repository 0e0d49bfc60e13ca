"""Batching, the partitioner, sequence numbers and retry ordering, without I/O."""

from __future__ import annotations

import random
from concurrent.futures import Future
from typing import Any

import httpx
import pytest

from eos_protocol.partitioning import murmur2
from sdk import (
    DeliveryTimeoutError,
    InvalidRecordError,
    KafkaStorageError,
    OutOfOrderSequenceNumberError,
    TopicPartition,
)
from sdk._accumulator import Partitioner, ProducerBatch, RecordAccumulator

pytestmark = pytest.mark.unit

TP = TopicPartition("t", 0)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def _murmur2_byte_by_byte(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as it is written there, a byte at a time: the reference
    the word-at-a-time version is checked against."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    length4 = len(data) // 4
    for i in range(length4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest, tail = len(data) % 4, len(data) & ~3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def test_murmur2_matches_the_byte_by_byte_reference_on_keys_of_every_length() -> None:
    rng = random.Random(7)
    for length in range(300):  # past the table of word unpackers (255 bytes)
        for _ in range(10):
            data = rng.randbytes(length)
            assert murmur2(data) == _murmur2_byte_by_byte(data), data


def test_keyed_records_are_stable_and_keyless_ones_sticky() -> None:
    partitioner = Partitioner(random.Random(1))
    assert {partitioner.partition("t", "user-1", 12) for _ in range(5)} == {
        (murmur2(b"user-1") & 0x7FFFFFFF) % 12
    }
    first = partitioner.partition("t", None, 12)
    assert all(partitioner.partition("t", None, 12) == first for _ in range(10))
    partitioner.on_new_batch("t", first, 12)
    assert partitioner.partition("t", None, 12) != first


def accumulator(**overrides: Any) -> RecordAccumulator:
    options: dict[str, Any] = dict(
        batch_size=1000, linger_ms=10, max_in_flight=5, delivery_timeout_ms=10_000,
        backoff=lambda exc, attempt: 0.1, batch_future=Future,
    )
    options.update(overrides)
    return RecordAccumulator(**options)


def add(acc: RecordAccumulator, n: int, now: int = 0, size: int = 100) -> list[Future[Any]]:
    futures: list[Future[Any]] = []
    for _ in range(n):
        future: Future[Any] = Future()
        acc.append(TP, None, "x" * size, None, None, future, now)
        futures.append(future)
    return futures


def drain(acc: RecordAccumulator, now: int) -> list[ProducerBatch]:
    batches, _ = acc.drain(now, lambda tp, most: most, 1, 0)
    for batch in batches:
        batch.on_wire = True
    return batches


def ok(acc: RecordAccumulator, batch: ProducerBatch, base: int, duplicate: bool = False) -> None:
    acc.complete(batch, {"base_offset": base, "log_append_time_ms": 5, "duplicate": duplicate})


def test_batches_fill_to_batch_size_and_wait_for_linger() -> None:
    acc = accumulator()
    add(acc, 7)  # 7 x ~140 bytes: the 8th would not fit in 1000
    batches, wake = acc.drain(5, lambda tp, most: most, 1, 0)
    assert batches == [] and wake == 10  # not full yet: it lingers
    add(acc, 1)
    batches = drain(acc, 5)
    assert len(batches) == 1 and len(batches[0].records) == 7  # closed by the next batch
    ok(acc, batches[0], 0)
    assert drain(acc, 9) == []
    assert [len(b.records) for b in drain(acc, 10)] == [1]  # the linger is up


def test_a_lingered_batch_waits_for_its_partitions_answer_a_full_one_does_not() -> None:
    acc = accumulator()
    add(acc, 1)
    (first,) = drain(acc, 10)  # lingered out, nothing in flight: it leaves
    add(acc, 1, now=10)
    # Lingered out too, but the first is unanswered: it keeps filling meanwhile.
    assert drain(acc, 20) == [] and drain(acc, 30) == []
    add(acc, 2, now=30)
    ok(acc, first, 0)
    (second,) = drain(acc, 31)
    assert len(second.records) == 3  # what came in while the first was in flight
    add(acc, 8, now=31)  # more than a batch: the full one is pipelined behind the second
    (full,) = drain(acc, 31)
    assert full.closed and len(full.records) == 7
    assert drain(acc, 100) == []  # the rest, lingered out, waits for an answer


def test_sequences_are_given_when_batches_leave() -> None:
    acc = accumulator(linger_ms=0)
    add(acc, 3, size=400)  # two records fill a batch
    batches = drain(acc, 0)
    ok(acc, batches[0], 0)
    batches += drain(acc, 0)
    assert [(b.base_sequence, len(b.records)) for b in batches] == [(0, 2), (2, 1)]
    assert acc.queues[TP].next_sequence == 3


def test_one_batch_on_the_wire_at_a_time_and_five_in_flight() -> None:
    acc = accumulator(linger_ms=0, batch_size=100)
    add(acc, 8)
    sent, _ = acc.drain(0, lambda tp, most: most, 1, 0)
    assert len(sent) == 1  # the next waits until this one's body is written
    sent[0].on_wire = True
    total = list(sent)
    for _ in range(10):
        total += drain(acc, 0)
    assert len(total) == 5  # max_in_flight
    ok(acc, total[0], 0)
    assert len(drain(acc, 0)) == 1


def test_nothing_leaves_for_a_partition_not_yet_added() -> None:
    acc = accumulator(linger_ms=0)
    add(acc, 1)
    assert acc.drain(0, lambda tp, most: 0, 1, 0)[0] == []


def test_a_retry_keeps_its_sequence_and_later_batches_wait_behind_it() -> None:
    acc = accumulator(linger_ms=0, batch_size=100)
    futures = add(acc, 3)
    b0, b1, b2 = drain(acc, 0) + drain(acc, 0) + drain(acc, 0)
    assert acc.failed(b0, KafkaStorageError("disk"), 0) is None  # retriable: requeued
    # the later ones arrive after a gap and are requeued too, not failed
    assert acc.failed(b2, OutOfOrderSequenceNumberError("gap"), 0) is None
    assert acc.failed(b1, OutOfOrderSequenceNumberError("gap"), 0) is None
    assert drain(acc, 50) == []  # the backoff of b0
    order = []
    for now in (100, 100, 100):
        (batch,) = drain(acc, now)
        order.append(batch)
        ok(acc, batch, batch.base_sequence or 0)
    assert order == [b0, b1, b2]
    assert [b.base_sequence for b in order] == [0, 1, 2]
    assert [f.result().offset for f in futures] == [0, 1, 2]


def test_a_lost_answer_comes_back_duplicate_with_the_first_offsets() -> None:
    acc = accumulator(linger_ms=0)
    (future,) = add(acc, 1)
    (batch,) = drain(acc, 0)
    assert acc.failed(batch, httpx.ReadError("lost"), 0) is None
    (again,) = drain(acc, 200)
    assert again is batch and again.base_sequence == 0
    ok(acc, again, 42, duplicate=True)
    assert future.result().offset == 42 and future.result().duplicate


def test_a_sequence_error_at_the_head_fails_and_breaks_the_sequence() -> None:
    acc = accumulator(linger_ms=0)
    (future,) = add(acc, 1)
    (batch,) = drain(acc, 0)
    error = acc.failed(batch, OutOfOrderSequenceNumberError("gap"), 0)
    assert isinstance(error, OutOfOrderSequenceNumberError)
    assert isinstance(future.exception(), OutOfOrderSequenceNumberError)
    assert acc.sequence_broken
    acc.reset_sequences()
    assert acc.queues[TP].next_sequence == 0 and not acc.sequence_broken


def test_non_retriable_errors_fail_the_batch() -> None:
    acc = accumulator(linger_ms=0)
    (future,) = add(acc, 1)
    (batch,) = drain(acc, 0)
    assert isinstance(acc.failed(batch, InvalidRecordError("bad"), 0), InvalidRecordError)
    assert batch.done.done() and isinstance(future.exception(), InvalidRecordError)


def test_delivery_timeout_fails_queued_and_retrying_batches() -> None:
    acc = accumulator(linger_ms=0, delivery_timeout_ms=1000, batch_size=100)
    first, second = add(acc, 2)
    (batch,) = drain(acc, 0)
    acc.failed(batch, KafkaStorageError("disk"), 10)
    acc.drain(1000, lambda tp, most: 0, 1, 0)
    assert isinstance(first.exception(), DeliveryTimeoutError)
    assert isinstance(second.exception(), DeliveryTimeoutError)
    assert acc.sequence_broken  # the retried batch had a sequence


def test_abort_drops_unsent_batches_and_reports_a_gap_for_retries() -> None:
    acc = accumulator(linger_ms=0, batch_size=100)
    futures = add(acc, 3)
    (sent,) = drain(acc, 0)
    assert not acc.abort_unsent(RuntimeError("aborted"))
    assert all(isinstance(f.exception(), RuntimeError) for f in futures[1:])
    assert not futures[0].done()  # in flight: waited for, not dropped
    acc.failed(sent, KafkaStorageError("disk"), 0)
    assert acc.abort_unsent(RuntimeError("aborted"))  # a retry with a sequence: a gap


def test_binary_and_text_records_do_not_share_a_batch() -> None:
    acc = accumulator(linger_ms=0)
    acc.append(TP, None, "text", None, None, Future(), 0)
    acc.append(TP, None, b"\x00", None, None, Future(), 0)
    batches = drain(acc, 0)
    ok(acc, batches[0], 0)
    batches += drain(acc, 0)
    assert [b.encoding for b in batches] == ["utf8", "base64"]
    assert batches[1].records[0]["value"] == "AA=="


def test_a_pipelined_batch_overtaken_by_the_node_is_retried_even_after_its_elders_succeed() -> None:
    """The node may handle a batch before its predecessor (it awaits between them); the
    predecessor's success can reach us before the later batch's OUT_OF_ORDER answer."""
    acc = accumulator(linger_ms=0, batch_size=100)
    first, second = add(acc, 2)
    b0 = drain(acc, 0)[0]
    b1 = drain(acc, 0)[0]
    assert b1.pipelined and not b0.pipelined
    ok(acc, b0, 0)
    assert acc.failed(b1, OutOfOrderSequenceNumberError("expected 0, got 1"), 0) is None
    (again,) = drain(acc, 0)
    assert again is b1 and not again.pipelined  # alone this time: a second error is real
    ok(acc, again, 1)
    assert [f.result().offset for f in (first, second)] == [0, 1]


def test_the_window_counts_from_the_oldest_unacknowledged_batch() -> None:
    """Answers come back out of order: with the first batch unanswered and the next four
    acknowledged, a sixth batch would push the first out of the node's memory of five, and
    the first one's retry would be refused as out of order instead of found a duplicate."""
    acc = accumulator(linger_ms=0, batch_size=100)
    add(acc, 7)
    first, *rest = [batch for _ in range(5) for batch in drain(acc, 0)]
    assert len(rest) == 4
    for base, batch in enumerate(rest, start=1):
        ok(acc, batch, base)
    assert drain(acc, 0) == []  # the first is unresolved: nothing beyond the window
    assert acc.failed(first, httpx.ReadTimeout("lost"), 0) is None
    assert drain(acc, 50) == []  # still unresolved while it waits for its retry
    (retry,) = drain(acc, 100)
    assert retry is first
    ok(acc, retry, 0, duplicate=True)
    assert [len(b.records) for b in drain(acc, 100) + drain(acc, 100)] == [1, 1]


def test_buffered_bytes_count_every_record_until_its_batch_ends_however_it_ends() -> None:
    """The count behind ``buffer_memory``: records enter it when queued (one by one or as
    a list), and leave it exactly once, with their batch, whether acknowledged, failed,
    expired or dropped by an abort."""
    acc = accumulator(linger_ms=0, batch_size=300, delivery_timeout_ms=1000)
    add(acc, 6)  # three batches of two records
    acc.extend(TP, None, ["y" * 100] * 4, None, None, [Future() for _ in range(4)], 0, 0,
               until_new_batch=False)  # fmt: skip
    per_record = 100 + 40
    assert acc.buffered_bytes == 10 * per_record
    first, second = drain(acc, 0) + drain(acc, 0)
    ok(acc, first, 0)
    assert acc.buffered_bytes == 8 * per_record
    acc.failed(second, InvalidRecordError("bad"), 0)  # not retriable: failed for good
    assert acc.buffered_bytes == 6 * per_record
    (retried,) = drain(acc, 0)
    acc.failed(retried, KafkaStorageError("disk"), 0)  # retriable: still buffered
    assert acc.buffered_bytes == 6 * per_record
    acc.drain(1000, lambda tp, most: 0, 1, 0)  # the delivery timeout expires them all
    assert acc.buffered_bytes == 0
    add(acc, 4)
    assert not acc.abort_unsent(RuntimeError("aborted"))
    assert acc.buffered_bytes == 0
