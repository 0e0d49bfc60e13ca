"""The pipeline task's output: a transform's records cut into large numbered batches.

A pipeline task writes everything it produces under one producer id and epoch: the epoch
its ``init`` took for the source partition's transactional id (exactly-once), or a fresh
idempotent producer id (at-least-once). The SDK's ``TransactionalProducer`` would do the
same, but record by record (a future, a lock and a state check per ``send``); in a Spark
task that bookkeeping costs more than reading, transforming and writing the record. Here
the task appends records to a plain list per target partition and hands whole batches
(thousands of records) to one sender thread, which produces them in order while the task
reads and transforms the next ones.

Why this keeps every guarantee of the producer it replaces:

* **Sequences.** Each target partition's records are numbered from 0: a new epoch (or a
  new producer id) starts the node's sequences at 0. One sender thread sends the batches
  one after the other and resends a failed one with the same sequence, so a resend is a
  duplicate on the node, never a second copy, and never out of order.
* **Transactions (KIP-890).** Before the first batch of a partition is queued, the
  partition is added to the transaction at the coordinator (all the new ones in one call),
  so the node accepts it. ``flush`` returns once every batch is acknowledged: the task
  commits only after that, and any failure reaches the task, which aborts.
* **Fencing.** The batches carry the epoch of the task's ``init``. Once a later attempt of
  the task has called ``init``, the node refuses them (``PRODUCER_FENCED`` or
  ``INVALID_PRODUCER_EPOCH``) and the coordinator refuses the old epoch's commit: the
  fenced attempt fails with a ``FatalError`` and nothing of it becomes visible.

Records go to their ``partition``, else to ``murmur2(key)`` like the SDK; keyless records
stick to one partition of their topic until its batch closes (the SDK's sticky choice).
"""

from __future__ import annotations

import base64
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eos_protocol.partitioning import keyed_partition
from sdk._types import Payload, TopicPartition
from spark_jobs._produce_many import BatchesTogether, SequencedBatch
from spark_jobs._wire import ProducerIdentity, SequencedPartitionWriter
from spark_jobs.transforms import OutputRecord

#: Bytes counted for a record beside its key and value (offsets, framing, JSON).
RECORD_OVERHEAD_BYTES = 48

#: How many cut batches may wait for the sender: enough to keep it busy while the task
#: transforms, few enough that a failed batch stops the task soon.
QUEUED_BATCHES = 4

AddPartitions = Callable[[Sequence[TopicPartition]], None]
#: A cut batch for the sender: (partition, base sequence, records, encoding); None stops it.
_Item = tuple[TopicPartition, int, list[dict[str, Any]], str] | None


@dataclass(frozen=True)
class BatchOptions:
    """How a task cuts its output: a batch closes at ``batch_records`` records or at
    ``batch_bytes`` of keys and values (a node accepts up to 100,000 records, 64 MB)."""

    batch_records: int = 10_000
    batch_bytes: int = 2 * 1024 * 1024


class _Buffer:
    """One target partition's records not yet cut into a batch."""

    __slots__ = ("binary", "records", "size")

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.size = 0
        self.binary = False


def _b64(payload: Payload | None) -> str | None:
    if payload is None:
        return None
    raw = payload.encode() if isinstance(payload, str) else payload
    return base64.b64encode(raw).decode("ascii")


def _as_base64(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch of records with bytes travels as base64 (the encoding is the batch's, so a
    text record never shares a batch with bytes: it would come back as bytes)."""
    return [{**r, "key": _b64(r.get("key")), "value": _b64(r.get("value"))} for r in records]


class BatchWriter:
    """Buffers a task's output per target partition and produces it in numbered batches.

    ``add_partitions`` (exactly-once only) adds partitions to the task's transaction; with
    None the batches are idempotent but not transactional. Use from one thread; ``close``
    always (it stops the sender thread).
    """

    def __init__(
        self,
        bootstrap_url: str,
        identity: ProducerIdentity,
        *,
        add_partitions: AddPartitions | None = None,
        options: BatchOptions | None = None,
    ) -> None:
        self.options = options or BatchOptions()
        self._writer = SequencedPartitionWriter(bootstrap_url, identity)
        self._add_partitions = add_partitions
        self._transactional = add_partitions is not None
        self._buffers: dict[str, dict[int, _Buffer]] = {}
        self._counts: dict[str, int] = {}
        self._sticky: dict[str, int] = {}
        self._next_sequence: dict[TopicPartition, int] = {}
        self._added: set[TopicPartition] = set()
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=QUEUED_BATCHES)
        self._together = BatchesTogether(self._writer)
        self._error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name="eos-batch-sender")
        self._sender.daemon = True
        self._sender.start()
        self.records = 0
        self.batches = 0
        self.duplicates = 0

    # --- the task's side -----------------------------------------------------------------

    def write(self, record: OutputRecord) -> None:
        """Append one record to its partition's buffer; cut a batch when it is full."""
        topic, value, key, partition, headers = record
        parts = self._buffers.get(topic)
        if parts is None:
            parts = self._buffers[topic] = {}
            self._counts[topic] = self._writer.partition_count(topic)
        if partition is None:
            if key is not None:
                count = self._counts[topic]
                partition = 0 if count == 1 else keyed_partition(key, count)
            else:
                partition = self._sticky.setdefault(topic, 0)
        buffer = parts.get(partition)
        if buffer is None:
            if not 0 <= partition < self._counts[topic]:
                raise ValueError(f"{topic} has no partition {partition}")
            buffer = parts[partition] = _Buffer()
        binary = isinstance(value, bytes) or isinstance(key, bytes)
        if binary is not buffer.binary:
            if buffer.records:  # a batch has one encoding: text stays text, bytes bytes
                self._cut(TopicPartition(topic, partition), buffer)
            buffer.binary = binary
        entry: dict[str, Any] = {"key": key, "value": value}
        if headers:
            entry["headers"] = headers
        buffer.records.append(entry)
        buffer.size += RECORD_OVERHEAD_BYTES + (0 if value is None else len(value)) + (
            0 if key is None else len(key)
        )
        self.records += 1
        if len(buffer.records) >= self.options.batch_records or (
            buffer.size >= self.options.batch_bytes
        ):
            self._cut(TopicPartition(topic, partition), buffer)

    def flush(self) -> None:
        """Send every buffered record and wait until the node acknowledged all of it."""
        for topic, parts in self._buffers.items():
            for partition, buffer in parts.items():
                if buffer.records:
                    self._cut(TopicPartition(topic, partition), buffer)
        self._raise_failure()
        self._queue.join()
        self._raise_failure()

    def close(self) -> None:
        """Stop the sender (batches still queued are dropped: the caller is failing, and
        its transaction is aborted or its records were never promised)."""
        if self._sender.is_alive():
            self._error = self._error or _Closed()
            self._drain()
            self._queue.put(None)
            self._sender.join()
        self._writer.close()

    # --- cutting and sending -------------------------------------------------------------

    def _cut(self, tp: TopicPartition, buffer: _Buffer) -> None:
        self._raise_failure()
        if tp not in self._added:
            self._add_new_partitions(tp)
        records, binary = buffer.records, buffer.binary
        buffer.records, buffer.size = [], 0
        sequence = self._next_sequence.get(tp, 0)
        self._next_sequence[tp] = sequence + len(records)
        if binary:
            records, encoding = _as_base64(records), "base64"
        else:
            encoding = "utf8"
        if tp.partition == self._sticky.get(tp.topic) and self._counts[tp.topic] > 1:
            self._sticky[tp.topic] = (tp.partition + 1) % self._counts[tp.topic]
        self.batches += 1
        self._queue.put((tp, sequence, records, encoding))

    def _add_new_partitions(self, tp: TopicPartition) -> None:
        """Add ``tp`` and every other partition holding output to the transaction, in one
        call, before any of their batches is queued (the node checks, KIP-890)."""
        new = {tp} | {
            TopicPartition(topic, p)
            for topic, parts in self._buffers.items()
            for p, buffer in parts.items()
            if buffer.records
        }
        new -= self._added
        if self._add_partitions is not None:
            self._add_partitions(sorted(new))
        self._added |= new

    def _send_loop(self) -> None:
        """Send the queued batches in order; the ones queued together, of distinct
        partitions, in one request per leader node (a partition's next batch waits for
        the next round, so its batches stay in sequence order)."""
        held: _Item | None = None
        while True:
            round_: list[_Item] = [held if held is not None else self._queue.get()]
            held = None
            seen = {round_[0][0]} if round_[0] is not None else set()
            while round_[-1] is not None and held is None:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None and item[0] in seen:
                    held = item  # the partition's next batch: the next round
                else:
                    round_.append(item)
                    if item is not None:
                        seen.add(item[0])
            batches = [item for item in round_ if item is not None]
            try:
                if batches and self._error is None:
                    outcomes = self._together.send([
                        SequencedBatch(tp, sequence, records, self._transactional, encoding)
                        for tp, sequence, records, encoding in batches
                    ])  # fmt: skip
                    for outcome in outcomes:
                        if isinstance(outcome, BaseException):
                            raise outcome
                        self.duplicates += int(outcome.duplicate)
            except BaseException as exc:  # handed to the task at its next call
                self._error = exc
            finally:
                for _ in round_:
                    self._queue.task_done()
            if round_[-1] is None:
                return

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
            self._queue.task_done()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error


class _Closed(Exception):
    """The writer was closed: what a sender still holding a batch sees."""
