"""Batching, partitioning and sequence numbers: the producer's record accumulator, no I/O.

Records wait in a per-partition queue of batches. A batch leaves when it is full
(``batch_size`` bytes), when it has waited ``linger_ms``, when a newer batch stands behind
it, or when the producer flushes. Sequence numbers are given when a batch leaves (Kafka's
rule), so a batch dropped before it was sent leaves no gap.

Ordering under retries: up to ``max_in_flight`` batches of one partition await their
acknowledgement. When one fails with a retriable error, the later ones come back with
OUT_OF_ORDER_SEQUENCE_NUMBER (they arrived after a gap) and are requeued behind it, and
from then on the partition sends one batch at a time, oldest first, until the queue of
retries is empty. A batch whose first attempt was written but whose answer was lost comes
back ``duplicate`` with its original offsets. Nothing is written twice, nothing reordered.
"""

from __future__ import annotations

import base64
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from eos_protocol.common import SEQUENCE_MODULUS
from eos_protocol.errors import EosError
from eos_protocol.partitioning import keyed_partition
from sdk._errors import DeliveryTimeoutError
from sdk._state import SEQUENCE_ERRORS
from sdk._transport import POLICIES, Req, Verdict, classify
from sdk._types import Payload, RecordMetadata, TopicPartition

T_contra = TypeVar("T_contra", contravariant=True)

RECORD_OVERHEAD_BYTES = 40  # JSON punctuation and field names around each record


class FutureLike(Protocol[T_contra]):
    """What both ``concurrent.futures.Future`` and ``asyncio.Future`` offer."""

    def set_result(self, result: T_contra, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...

    def done(self) -> bool: ...


def _settle(future: FutureLike[Any], result: Any = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


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
    futures: list[FutureLike[RecordMetadata]] = field(default_factory=list)
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


def record_size(
    key: Payload | None, value: Payload | None, headers: dict[str, str] | None, binary: bool
) -> int:
    size = RECORD_OVERHEAD_BYTES
    for part in (key, value):
        if part is not None:
            size += len(part) * 4 // 3 + 4 if binary else len(part)
    if headers:
        size += sum(len(k) + len(v) + 6 for k, v in headers.items())
    return size


@dataclass
class PartitionQueue:
    unsent: deque[ProducerBatch] = field(default_factory=deque)
    in_flight: list[ProducerBatch] = field(default_factory=list)
    retries: list[ProducerBatch] = field(default_factory=list)
    next_sequence: int = 0
    next_order: int = 0

    def earlier_unresolved(self, batch: ProducerBatch) -> bool:
        return any(b.order < batch.order for b in (*self.in_flight, *self.retries))


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
    ) -> None:
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.max_in_flight = max_in_flight
        self.delivery_timeout_ms = delivery_timeout_ms
        self._backoff = backoff
        self._batch_future = batch_future
        self.queues: dict[TopicPartition, PartitionQueue] = {}
        self.flushing = False
        self.sequence_broken = False  # a batch with a sequence failed: sequences need reset
        self.last_closed = False  # the last append filled its batch

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
        """Add a record; returns True if it opened a new batch."""
        binary = isinstance(key, bytes) or isinstance(value, bytes)
        encoding = "base64" if binary else "utf8"
        size = record_size(key, value, headers, binary)
        queue = self.queues.setdefault(tp, PartitionQueue())
        batch = queue.unsent[-1] if queue.unsent else None
        new = (
            batch is None
            or batch.closed
            or batch.encoding != encoding
            or (bool(batch.records) and batch.size + size > self.batch_size)
        )
        if new:
            if batch is not None:
                batch.closed = True
            batch = ProducerBatch(tp, encoding, now_ms, self._batch_future())
            queue.unsent.append(batch)
        assert batch is not None
        record: dict[str, Any] = {
            "key": encode_payload(key, encoding),
            "value": encode_payload(value, encoding),
        }
        if headers:
            record["headers"] = headers
        if timestamp_ms is not None:
            record["timestamp_ms"] = timestamp_ms
        batch.records.append(record)
        batch.futures.append(future)
        batch.size += size
        self.last_closed = batch.size >= self.batch_size
        if self.last_closed:
            batch.closed = True
        return new

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
                and len(queue.in_flight) < limit
                and all(b.on_wire for b in queue.in_flight)
            ):
                batch = queue.unsent[0]
                due = batch.created_ms + self.linger_ms
                if not (batch.closed or self.flushing or due <= now_ms):
                    later(due)
                    break
                queue.unsent.popleft()
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

    def complete(self, batch: ProducerBatch, body: dict[str, Any]) -> None:
        """The node acknowledged the batch (perhaps as a duplicate of an earlier attempt)."""
        queue = self.queues[batch.tp]
        if batch in queue.in_flight:
            queue.in_flight.remove(batch)
        base, ts = int(body["base_offset"]), int(body["log_append_time_ms"])
        duplicate = bool(body.get("duplicate", False))
        for i, future in enumerate(batch.futures):
            meta = RecordMetadata(batch.tp.topic, batch.tp.partition, base + i, ts, duplicate)
            _settle(future, meta)
        _settle(batch.done)

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
        for future in batch.futures:
            _settle(future, exc=exc)
        _settle(batch.done)  # "done" says settled; the records' futures carry the error

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
