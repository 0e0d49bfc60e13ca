"""Batching, partitioning and sequence numbers: the producer's record accumulator, no I/O.

Records wait in a per-partition queue of batches. A batch leaves when it is full
(``batch_size`` bytes), when a newer batch stands behind it, when the producer flushes, or
when it has waited ``linger_ms`` and no earlier batch of its partition is unanswered: under
load a batch fills for as long as its partition's last request takes (keyed records over
many partitions made batches of a few dozen records, each a request). Sequence numbers
are given when a batch leaves (Kafka's rule), so a dropped unsent batch leaves no gap.

Ordering under retries: a partition's batches in flight span at most ``max_in_flight``
sequence-ordered batches, counted from the oldest one not yet acknowledged (answers come
back out of order; the node remembers only the last five batches). When one fails with a
retriable error, the later ones come back with OUT_OF_ORDER_SEQUENCE_NUMBER (they arrived
after a gap) and are requeued behind it, and from then on the partition sends one batch
at a time, oldest first, until the queue of retries is empty. A batch whose first attempt
was written but whose answer was lost comes back ``duplicate`` with its original offsets.
Nothing is written twice, nothing reordered.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from eos_protocol.common import SEQUENCE_MODULUS
from eos_protocol.errors import EosError
from eos_protocol.partitioning import keyed_partition
from sdk._errors import DeliveryTimeoutError
from sdk._record_futures import RecordFuturesBase, Segment, acked, failed
from sdk._state import SEQUENCE_ERRORS
from sdk._transport import POLICIES, Req, Verdict, classify
from sdk._types import Payload, RecordMetadata, TopicPartition

T_contra = TypeVar("T_contra", contravariant=True)

RECORD_OVERHEAD_BYTES = 40  # JSON punctuation and field names around each record
#: The most one produce request carries when closed batches of a partition are sent
#: together (Kafka's ``max.request.size`` default).
MAX_REQUEST_BYTES = 1024 * 1024
#: The node's limit of records in one batch (``partition_service.partition.Limits``).
MAX_BATCH_RECORDS = 100_000

_INVALID_STATE = (concurrent.futures.InvalidStateError, asyncio.InvalidStateError)
_new_tuple = tuple.__new__
_PER_RECORD = (tuple, list)  # how ``extend`` is given a future per record


class FutureLike(Protocol[T_contra]):
    """What both ``concurrent.futures.Future`` and ``asyncio.Future`` offer."""

    def set_result(self, result: T_contra, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...

    def done(self) -> bool: ...


def _settle(future: FutureLike[Any], result: Any = None, exc: BaseException | None = None) -> None:
    """Settle ``future`` unless it already is (the caller may have cancelled it). Asking
    ``done()`` first would take a thread future's lock twice per record."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except _INVALID_STATE:
        pass


# --- partitioner -------------------------------------------------------------------------


class Partitioner:
    """Kafka's default: keyed records by ``murmur2(key) & 0x7fffffff % n`` (stable across
    runs and clients); keyless records stick to one partition until its batch is
    closed, then move to another (KIP-480), so they fill batches instead of scattering."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: Payload | None, partitions: int) -> int:
        if key is not None:
            return keyed_partition(key, partitions)
        current = self._sticky.get(topic)
        if current is None or current >= partitions:
            current = self._sticky[topic] = self._rng.randrange(partitions)
        return current

    def on_new_batch(self, topic: str, previous: int, partitions: int) -> None:
        """The sticky partition's batch closed: pick another one for the next records."""
        if self._sticky.get(topic) != previous:
            return
        if partitions > 1:
            choice = self._rng.randrange(partitions - 1)
            self._sticky[topic] = choice if choice < previous else choice + 1


# --- batches -----------------------------------------------------------------------------


def encode_payload(value: Payload | None, encoding: str) -> str | None:
    if value is None:
        return None
    if encoding == "base64":
        raw = value if isinstance(value, bytes) else value.encode()
        return base64.b64encode(raw).decode("ascii")
    assert isinstance(value, str)
    return value


@dataclass(eq=False)
class ProducerBatch:
    """Records for one partition, sent and acknowledged together."""

    tp: TopicPartition
    encoding: str
    created_ms: int
    done: FutureLike[None]
    records: list[dict[str, Any]] = field(default_factory=list)
    #: A future per record of ``send``, a ``Segment`` per run of a ``send_many`` list.
    futures: list[FutureLike[RecordMetadata] | Segment] = field(default_factory=list)
    size: int = 0
    closed: bool = False
    order: int = -1  # position among the partition's sent batches
    base_sequence: int | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    attempts: int = 0
    retry_at_ms: int = 0
    on_wire: bool = False  # the request's body has been written to the connection
    pipelined: bool = False  # sent while an earlier batch of its partition was unanswered
    #: The done-futures of closed batches this one took along into its request.
    absorbed: list[FutureLike[None]] = field(default_factory=list)

    def settle_done(self) -> None:
        _settle(self.done)
        for done in self.absorbed:
            _settle(done)

    def request_body(self, transactional: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"encoding": self.encoding, "records": self.records}
        if self.producer_id >= 0:
            body.update(
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                transactional=transactional,
            )
        return body


@dataclass
class PartitionQueue:
    unsent: deque[ProducerBatch] = field(default_factory=deque)
    in_flight: list[ProducerBatch] = field(default_factory=list)
    retries: list[ProducerBatch] = field(default_factory=list)
    next_sequence: int = 0
    next_order: int = 0

    def earlier_unresolved(self, batch: ProducerBatch) -> bool:
        return any(b.order < batch.order for b in (*self.in_flight, *self.retries))

    def window_used(self) -> int:
        """How many batches the node must still remember for a retry to be recognised.

        The node keeps the metadata of a producer's last five batches per partition, so
        a retry is only known as a duplicate if fewer than five batches were appended
        after it. Answers overlap and may come back out of order, so the count is not of
        the batches awaiting an answer but of every batch from the oldest unresolved one
        to the newest sent: with batches 2..5 acknowledged and 1 still unresolved, a sixth
        would push 1 out of the node's memory, and its retry would come back
        OUT_OF_ORDER_SEQUENCE_NUMBER instead of duplicate.
        """
        unresolved = [b.order for b in (*self.in_flight, *self.retries)]
        return self.next_order - min(unresolved) if unresolved else 0


class RecordAccumulator:
    """The queues of every partition. ``batch_future`` makes the future each batch
    settles when it is done, of the flavour (thread or asyncio) the producer waits on."""

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        max_in_flight: int,
        delivery_timeout_ms: int,
        backoff: Callable[[BaseException | None, int], float],
        batch_future: Callable[[], FutureLike[None]],
        max_request_bytes: int | None = None,
    ) -> None:
        """``max_request_bytes``: when a partition may have fewer batches in flight than
        ``max_in_flight`` (a transaction's first batch to a partition goes alone), a batch
        leaving with closed batches queued behind it takes them along in its request, as
        many as the missing places would have carried and at most this many bytes, so
        the one round trip carries what the window would have (None: never)."""
        self.batch_size = batch_size
        self.max_request_bytes = max_request_bytes
        self.linger_ms = linger_ms
        self.max_in_flight = max_in_flight
        self.delivery_timeout_ms = delivery_timeout_ms
        self._backoff = backoff
        self._batch_future = batch_future
        self.queues: dict[TopicPartition, PartitionQueue] = {}
        self.flushing = False
        self.sequence_broken = False  # a batch with a sequence failed: sequences need reset
        self.last_closed = False  # the last append filled its batch
        self.buffered_bytes = 0  # of the records queued, in flight or awaiting a retry

    # --- appending -----------------------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        key: Payload | None,
        value: Payload | None,
        headers: dict[str, str] | None,
        timestamp_ms: int | None,
        future: FutureLike[RecordMetadata],
        now_ms: int,
    ) -> bool:
        """Add a record; returns True if it opened a new batch. (``extend`` for one
        record, written out: this is ``send``'s path, once per record.)"""
        if isinstance(key, bytes) or isinstance(value, bytes):
            encoding = "base64"
            size = RECORD_OVERHEAD_BYTES + sum(
                len(p) * 4 // 3 + 4 for p in (key, value) if p is not None
            )
            record: dict[str, Any] = {
                "key": encode_payload(key, encoding),
                "value": encode_payload(value, encoding),
            }
        else:
            encoding = "utf8"
            size = RECORD_OVERHEAD_BYTES + (0 if key is None else len(key)) + (
                0 if value is None else len(value)
            )
            record = {"key": key, "value": value}
        if headers:
            size += sum(len(k) + len(v) + 6 for k, v in headers.items())
            record["headers"] = headers
        if timestamp_ms is not None:
            record["timestamp_ms"] = timestamp_ms
        queue = self.queues.get(tp)
        if queue is None:
            queue = self.queues[tp] = PartitionQueue()
        unsent = queue.unsent
        batch = unsent[-1] if unsent else None
        new = (
            batch is None
            or batch.closed
            or batch.encoding != encoding
            or (batch.size + size > self.batch_size and bool(batch.records))
        )
        if new:
            if batch is not None:
                batch.closed = True
            batch = ProducerBatch(tp, encoding, now_ms, self._batch_future())
            unsent.append(batch)
        assert batch is not None
        batch.records.append(record)
        batch.futures.append(future)
        batch.size += size
        self.buffered_bytes += size
        self.last_closed = batch.size >= self.batch_size
        if self.last_closed:
            batch.closed = True
        return new

    def extend(
        self,
        tp: TopicPartition,
        keys: Sequence[Payload | None] | None,
        values: Sequence[Payload | None],
        headers: dict[str, str] | None,
        timestamp_ms: int | None,
        futures: Sequence[FutureLike[RecordMetadata]] | RecordFuturesBase[Any],
        start: int,
        now_ms: int,
        *,
        until_new_batch: bool,
        stop: int | None = None,
    ) -> tuple[int, bool]:
        """Add records ``start:stop`` of ``values`` (with ``keys``, the same headers and
        timestamp for each) to ``tp``; returns the index after the last one added, and
        whether a batch was opened. With ``until_new_batch`` it stops after the record
        that opened a batch: the sticky partitioner moves on there (KIP-480), so the
        records after it belong to another partition. ``futures`` is a future per
        record, or the ``RecordFutures`` of a list: its records then enter each batch as
        one ``Segment``.

        This is the per-record path of ``send`` and ``send_many`` alike, so it is written
        for speed: one loop, no calls per record but the record's dictionary and lengths.
        """
        queue = self.queues.get(tp)
        if queue is None:
            queue = self.queues[tp] = PartitionQueue()
        unsent = queue.unsent
        batch = unsent[-1] if unsent else None
        limit = self.batch_size
        extra = RECORD_OVERHEAD_BYTES
        if headers:
            extra += sum(len(k) + len(v) + 6 for k, v in headers.items())
        opened = False
        closed = False
        grouped = not isinstance(futures, _PER_RECORD)  # an ABC's isinstance is slow
        i, n = start, len(values) if stop is None else stop
        run_start = i  # the first record of the group's run in ``batch``
        while i < n:
            key = None if keys is None else keys[i]
            value = values[i]
            binary = isinstance(key, bytes) or isinstance(value, bytes)
            if binary:
                encoding = "base64"
                size = extra + sum(len(p) * 4 // 3 + 4 for p in (key, value) if p is not None)
            else:
                encoding = "utf8"
                size = extra + (0 if key is None else len(key)) + (
                    0 if value is None else len(value)
                )
            if (
                batch is None
                or batch.closed
                or batch.encoding != encoding
                or (batch.size + size > limit and batch.records)
            ):
                if batch is not None:
                    batch.closed = True
                    if grouped and i > run_start:
                        batch.futures.append(Segment(futures, run_start, i))  # type: ignore[arg-type]
                run_start = i
                batch = ProducerBatch(tp, encoding, now_ms, self._batch_future())
                unsent.append(batch)
                opened = True
            if binary:
                record: dict[str, Any] = {
                    "key": encode_payload(key, encoding),
                    "value": encode_payload(value, encoding),
                }
            else:
                record = {"key": key, "value": value}
            if headers:
                record["headers"] = headers
            if timestamp_ms is not None:
                record["timestamp_ms"] = timestamp_ms
            batch.records.append(record)
            if not grouped:
                batch.futures.append(futures[i])
            batch.size += size
            self.buffered_bytes += size
            i += 1
            closed = batch.size >= limit
            if closed:
                batch.closed = True
            if opened and until_new_batch:
                break
        if grouped and batch is not None and i > run_start:
            batch.futures.append(Segment(futures, run_start, i))  # type: ignore[arg-type]
        self.last_closed = closed
        return i, opened

    # --- draining ------------------------------------------------------------------------

    def drain(
        self,
        now_ms: int,
        in_flight_limit: Callable[[TopicPartition, int], int],
        producer_id: int,
        producer_epoch: int,
    ) -> tuple[list[ProducerBatch], int | None]:
        """Batches to send now, and when to look again (None: nothing is waiting).
        ``in_flight_limit(tp, max_in_flight)`` caps a partition's batches in flight (0: it
        may not send yet)."""
        out: list[ProducerBatch] = []
        wake: int | None = None

        def later(at: int) -> None:
            nonlocal wake
            wake = at if wake is None else min(wake, at)

        for tp, queue in self.queues.items():
            self._expire(queue, now_ms)
            if queue.retries:
                head = queue.retries[0]
                if not queue.in_flight:
                    if head.retry_at_ms <= now_ms:
                        queue.retries.pop(0)
                        queue.in_flight.append(head)
                        head.pipelined = False
                        head.attempts += 1
                        head.on_wire = False
                        out.append(head)
                    else:
                        later(head.retry_at_ms)
                continue
            limit = in_flight_limit(tp, self.max_in_flight)
            # One batch of a partition is written to the wire at a time: requests travel on
            # separate connections, and a later batch that overtook an earlier one would
            # only come back OUT_OF_ORDER_SEQUENCE_NUMBER. Their answers still overlap.
            while (
                queue.unsent
                and queue.window_used() < limit
                and all(b.on_wire for b in queue.in_flight)
            ):
                batch = queue.unsent[0]
                due = batch.created_ms + self.linger_ms
                if not (batch.closed or self.flushing or due <= now_ms):
                    later(due)
                    break
                if not (batch.closed or self.flushing) and queue.in_flight:
                    break  # lingered out, but an answer is pending: it fills until then
                queue.unsent.popleft()
                throttled = limit < self.max_in_flight
                if batch.closed and self.max_request_bytes is not None and throttled:
                    # The partition may have fewer batches in flight than the others (a
                    # transaction's first batch goes alone): the request carries what
                    # the missing places would have.
                    room = self.batch_size * (self.max_in_flight - limit + 1)
                    self._take_along(queue, batch, min(self.max_request_bytes, room))
                batch.closed = True
                batch.pipelined = bool(queue.in_flight)
                batch.order = queue.next_order
                queue.next_order += 1
                if producer_id >= 0:
                    batch.producer_id, batch.producer_epoch = producer_id, producer_epoch
                    batch.base_sequence = queue.next_sequence
                    queue.next_sequence = (
                        queue.next_sequence + len(batch.records)
                    ) % SEQUENCE_MODULUS
                queue.in_flight.append(batch)
                batch.attempts += 1
                batch.on_wire = False
                out.append(batch)
        return out, wake

    @staticmethod
    def _take_along(queue: PartitionQueue, batch: ProducerBatch, most: int) -> None:
        """Move the closed batches queued behind ``batch`` into it, while the request stays
        within ``most`` bytes and the node's records limit. Only batches never sent are
        taken (none has a sequence number yet), and in their order, so the records keep
        theirs; each one's done-future is settled with ``batch``."""
        unsent = queue.unsent
        while unsent:
            nxt = unsent[0]
            if (
                not nxt.closed
                or nxt.encoding != batch.encoding
                or batch.size + nxt.size > most
                or len(batch.records) + len(nxt.records) > MAX_BATCH_RECORDS
            ):
                return
            unsent.popleft()
            batch.records.extend(nxt.records)
            batch.futures.extend(nxt.futures)
            batch.size += nxt.size
            batch.absorbed.append(nxt.done)
            batch.absorbed.extend(nxt.absorbed)

    def expire(self, now_ms: int) -> None:
        """Fail what outlived ``delivery_timeout_ms`` while nothing could be drained."""
        for queue in self.queues.values():
            self._expire(queue, now_ms)

    def _expire(self, queue: PartitionQueue, now_ms: int) -> None:
        def expired(batch: ProducerBatch) -> bool:
            return now_ms >= batch.created_ms + self.delivery_timeout_ms

        while queue.unsent and expired(queue.unsent[0]):
            batch = queue.unsent.popleft()
            self._fail(batch, DeliveryTimeoutError(f"{batch.tp} batch not sent in time"))
        for batch in [b for b in queue.retries if expired(b)]:
            queue.retries.remove(batch)
            self.sequence_broken = True
            self._fail(batch, DeliveryTimeoutError(f"{batch.tp} batch not acknowledged in time"))

    # --- answers -------------------------------------------------------------------------

    def complete(
        self, batch: ProducerBatch, body: dict[str, Any], *, settle: bool = True
    ) -> Callable[[], None]:
        """The node acknowledged the batch (perhaps as a duplicate of an earlier attempt).

        Returns what settles the records' futures and the batch's done-future; with
        ``settle=False`` the caller runs it later, outside its lock (settling thousands
        of thread futures under the lock the application's ``send`` takes would stall
        it for as long)."""
        queue = self.queues[batch.tp]
        if batch in queue.in_flight:
            queue.in_flight.remove(batch)
        self.buffered_bytes -= batch.size  # its own and those it took along
        base, ts = int(body["base_offset"]), int(body["log_append_time_ms"])
        duplicate = bool(body.get("duplicate", False))

        def run() -> None:
            topic, partition = batch.tp
            offset = base
            for entry in batch.futures:
                if isinstance(entry, Segment):
                    start, stop = entry.start, entry.stop
                    entry.group.settle(
                        start, stop, acked(start, stop, topic, partition, offset, ts, duplicate)
                    )
                    offset += stop - start
                else:
                    meta = _new_tuple(RecordMetadata, (topic, partition, offset, ts, duplicate))
                    _settle(entry, meta)
                    offset += 1
            batch.settle_done()

        if settle:
            run()
        return run

    def failed(self, batch: ProducerBatch, exc: BaseException, now_ms: int) -> BaseException | None:
        """A send of ``batch`` failed. Returns None if it will be retried, else the error
        it was failed with (the producer reacts to it)."""
        queue = self.queues[batch.tp]
        if batch in queue.in_flight:
            queue.in_flight.remove(batch)
        verdict = classify(POLICIES[Req.PRODUCE], exc)
        # A sequence error is only genuine for a batch sent when nothing earlier of its
        # partition was unanswered: a pipelined one may simply have been handled before its
        # predecessor (the node may await between two batches), so it is sent again, alone.
        behind_a_gap = (
            isinstance(exc, EosError)
            and exc.code in SEQUENCE_ERRORS
            and (batch.pipelined or queue.earlier_unresolved(batch))
        )
        in_time = now_ms < batch.created_ms + self.delivery_timeout_ms
        if (verdict is not Verdict.FAIL or behind_a_gap) and in_time:
            # Behind a gap the node is fine: resend as soon as the earlier batch is done.
            delay = 0.0 if behind_a_gap else self._backoff(exc, batch.attempts)
            batch.retry_at_ms = now_ms + int(delay * 1000)
            queue.retries.append(batch)
            queue.retries.sort(key=lambda b: b.order)
            return None
        if not in_time and verdict is not Verdict.FAIL:
            exc = DeliveryTimeoutError(f"{batch.tp} not acknowledged in time (last: {exc!r})")
        if batch.base_sequence is not None:
            self.sequence_broken = True
        self._fail(batch, exc)
        return exc

    def _fail(self, batch: ProducerBatch, exc: BaseException) -> None:
        self.buffered_bytes -= batch.size
        for entry in batch.futures:
            if isinstance(entry, Segment):
                entry.group.settle(entry.start, entry.stop, failed(entry.start, entry.stop, exc))
            else:
                _settle(entry, exc=exc)
        batch.settle_done()  # "done" says settled; the records' futures carry the error

    # --- whole-producer operations -------------------------------------------------------

    def abort_unsent(self, exc: BaseException) -> bool:
        """Drop every batch not in flight (abort). Returns True if a dropped batch had a
        sequence number (a retry), which leaves a gap: the epoch must be bumped."""
        gap = False
        for queue in self.queues.values():
            for batch in (*queue.unsent, *queue.retries):
                gap = gap or batch.base_sequence is not None
                self._fail(batch, exc)
            queue.unsent.clear()
            queue.retries.clear()
        return gap

    def reset_sequences(self) -> None:
        """A new producer id or epoch: every partition starts again at sequence 0."""
        for queue in self.queues.values():
            queue.next_sequence = 0
        self.sequence_broken = False

    def pending_done(self) -> list[FutureLike[None]]:
        """The done-futures of every batch not yet settled."""
        return [b.done for q in self.queues.values() for b in (*q.unsent, *q.in_flight, *q.retries)]

    def in_flight_count(self) -> int:
        return sum(len(q.in_flight) + len(q.retries) for q in self.queues.values())

    def has_unsent(self) -> bool:
        return any(q.unsent for q in self.queues.values())

    def partitions_with_data(self) -> Iterable[TopicPartition]:
        return (tp for tp, q in self.queues.items() if q.unsent)


__all__ = [
    "FutureLike",
    "Partitioner",
    "ProducerBatch",
    "RecordAccumulator",
]
