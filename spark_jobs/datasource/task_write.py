"""The tasks' half of a write: a task's rows as numbered batches in the task's own slot.

Every task of a write (a batch write, or one micro-batch of a stream) produces under the
producer id and epoch of the one transaction the driver owns. Several tasks may write the
same target partition, so each numbers its batches in a sequence space of its own, its
*slot* (``ProduceRequest.slot``): the task's Spark partition id, the same for every attempt
of that task. Within the slot the task numbers its records 0, 1, 2 … per target partition
and cuts them into batches deterministically:

* the task's records for one target partition are sorted by content (``sortWithinTask``,
  default on; off, the input order must itself be deterministic), then cut at
  ``batchRecords`` records or before ``batchBytes`` bytes;
* so a retried or speculative attempt sends exactly the batches of the first attempt with
  the same sequences, and the node answers each as a duplicate;
* an attempt that is behind another by more batches than the node remembers learns from
  ``last_sequence(slot=)`` how far the slot got and skips those batches (every attempt
  asks before its first batch, for all its partitions at once: ``last_sequences``).

Nothing is ever written twice, and the commit message tells the driver how many records
each (partition, slot) must hold, which it checks before committing.

In at-least-once mode a task takes an idempotent producer id of its own and writes without
a transaction: a resent batch is a duplicate, a retried task writes its output again.

The writers are Arrow writers (``DataSourceArrowWriter``): Spark hands a task its rows as
Arrow record batches, which ``rows_of`` turns into plain dicts column by column, far
cheaper than one pickled ``Row`` per record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from eos_protocol.errors import OutOfOrderSequenceNumberError
from sdk import TopicPartition
from spark_jobs._produce_many import BatchesTogether, Outcome, SequencedBatch
from spark_jobs._wire import (
    PartitionFetcher,
    ProducerIdentity,
    SequencedPartitionWriter,
    SlotKey,
    request_producer_id,
)
from spark_jobs.datasource import planted_fault
from spark_jobs.datasource.options import Connection
from spark_jobs.datasource.records import row_fields, sort_key, target_of, wire_record

#: Bytes counted for a record beside its key and value (offsets, framing, JSON).
RECORD_OVERHEAD_BYTES = 48

AddPartitions = Callable[[Sequence[TopicPartition]], None]
#: Called by a task after each batch it wrote or skipped: (partition, the partition's batch
#: index in the task). A test seam (a fault at a chosen point) and a progress hook.
AfterBatch = Callable[[TopicPartition, int], None]


@dataclass(frozen=True)
class TaskWriteSpec:
    """What every task of a write needs, decided on the driver."""

    connection: Connection
    default_topic: str | None
    binary: bool
    batch_records: int
    batch_bytes: int
    sort: bool


@dataclass
class Written(WriterCommitMessage):
    """One task's commit message: under which producer it wrote, in which slot, and how
    many records each target partition got (``skipped``: the batch was committed already,
    so the task wrote nothing)."""

    producer_id: int | None
    producer_epoch: int | None
    slot: int | None
    records: dict[tuple[str, int], int] = field(default_factory=dict)
    duplicate_batches: int = 0
    skipped_batches: int = 0
    skipped: bool = False

    @property
    def total(self) -> int:
        return sum(self.records.values())


def rows_of(record_batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """An Arrow writer's input, a record batch at a time, as one dict per row."""
    for record_batch in record_batches:
        yield from record_batch.to_pylist()


def cut_batches(
    records: Iterable[dict[str, Any]],
    batch_records: int,
    batch_bytes: int,
    overhead: int = RECORD_OVERHEAD_BYTES,
) -> Iterator[list[dict[str, Any]]]:
    """The deterministic cut of a task's records for one partition: a batch closes at
    ``batch_records`` records or before it would pass ``batch_bytes`` of keys and values
    (each counted with ``overhead``), so every attempt of a task cuts the same batches and
    numbers them with the same sequences."""
    batch: list[dict[str, Any]] = []
    size = 0
    for record in records:
        length = len(record.get("key") or "") + len(record.get("value") or "") + overhead
        if batch and (len(batch) >= batch_records or size + length > batch_bytes):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += length
    if batch:
        yield batch


def batches(
    records: Iterable[dict[str, Any]], spec: TaskWriteSpec
) -> Iterator[list[dict[str, Any]]]:
    """A sorted task's cut of one partition's records (``cut_batches`` with its limits)."""
    return cut_batches(records, spec.batch_records, spec.batch_bytes)


class RowTargets:
    """Where a task's rows go: each row's wire record and target partition (the topic's
    partition count asked once per topic)."""

    def __init__(self, spec: TaskWriteSpec, writer: SequencedPartitionWriter) -> None:
        self.spec = spec
        self.writer = writer
        self.counts: dict[str, int] = {}

    def __call__(self, row: Any) -> tuple[TopicPartition, dict[str, Any]]:
        fields = row_fields(row)
        topic = fields.get("topic") or self.spec.default_topic
        if topic is not None and topic not in self.counts:
            self.counts[topic] = self.writer.partition_count(topic)
        name, partition = target_of(fields, self.spec.default_topic, self.counts)
        return TopicPartition(name, partition), wire_record(fields, self.spec.binary)


def group_rows(
    rows: Iterable[Any], spec: TaskWriteSpec, writer: SequencedPartitionWriter
) -> dict[TopicPartition, list[dict[str, Any]]]:
    """The task's rows as wire records per target partition, in writing order (sorted by
    content when ``spec.sort``)."""
    target = RowTargets(spec, writer)
    targets: dict[TopicPartition, list[dict[str, Any]]] = {}
    for row in rows:
        tp, record = target(row)
        targets.setdefault(tp, []).append(record)
    if spec.sort:
        for records in targets.values():
            records.sort(key=sort_key)
    return targets


class SlotSender:
    """One target partition's batches in the task's slot, numbered from sequence 0: each
    sent, or skipped when the slot already holds it (another attempt of the task got
    further than the node remembers batches of).

    ``written`` is the slot's last sequence on the node when the sender starts: the
    task asks it of every partition it opens at once (``open_slot_senders``), one request
    per leader node, not one per partition."""

    def __init__(
        self,
        writer: SequencedPartitionWriter,
        tp: TopicPartition,
        spec: TaskWriteSpec,
        *,
        slot: int | None,
        transactional: bool,
        written: int,
    ) -> None:
        self.writer, self.tp, self.slot = writer, tp, slot
        self.transactional = transactional
        self.encoding = "base64" if spec.binary else "utf8"
        self.written = written
        self.sequence = self.duplicates = self.skipped = 0

    def send(self, batch: list[dict[str, Any]]) -> None:
        planned = self.plan(batch)
        if planned is None:
            return
        try:
            outcome: Outcome = self.writer.produce(
                self.tp, planned.base_sequence, batch, transactional=self.transactional,
                encoding=self.encoding, slot=self.slot,
            )  # fmt: skip
        except OutOfOrderSequenceNumberError as exc:
            outcome = exc
        self.settle(planned, outcome)

    def plan(self, batch: list[dict[str, Any]]) -> SequencedBatch | None:
        """The batch at its sequence, or None when the slot already holds it (skipped)."""
        first, last = self.sequence, self.sequence + len(batch) - 1
        self.sequence = last + 1
        if last <= self.written:
            self.skipped += 1
            return None
        return SequencedBatch(self.tp, first, batch, self.transactional, self.encoding,
                              self.slot)  # fmt: skip

    def settle(self, planned: SequencedBatch, outcome: Outcome) -> None:
        """A planned batch's outcome: counted, or raised. Out of order: another attempt of
        this task is ahead by more batches than the node remembers; if it wrote this batch
        (the same batch), it is skipped."""
        last = planned.base_sequence + len(planned.records) - 1
        if isinstance(outcome, OutOfOrderSequenceNumberError):
            self.written = self.writer.last_sequence(self.tp, slot=self.slot)
            if last > self.written:
                raise outcome
            self.skipped += 1
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            self.duplicates += int(outcome.duplicate)


def open_slot_senders(
    writer: SequencedPartitionWriter,
    tps: Sequence[TopicPartition],
    spec: TaskWriteSpec,
    *,
    slot: int | None,
    transactional: bool,
) -> dict[TopicPartition, SlotSender]:
    """A sender for each of ``tps``, started from how far the slot got on each partition,
    asked with one request per leader node."""
    written = writer.last_sequences((tp, slot) for tp in tps)
    return {
        tp: SlotSender(writer, tp, spec, slot=slot, transactional=transactional,
                       written=written[(tp, slot)])
        for tp in tps
    }  # fmt: skip


def write_task(
    rows: Iterable[Any],
    spec: TaskWriteSpec,
    identity: ProducerIdentity,
    *,
    slot: int | None,
    add_partitions: AddPartitions | None,
    after_batch: AfterBatch | None = None,
) -> Written:
    """A task's whole output in its slot. Sorted (``spec.sort``): grouped per target
    partition, sorted, the partitions added to the transaction (``add_partitions``; None:
    idempotent, not transactional), then written. Unsorted: written as the rows come, a
    partition added when its first batch is cut, so a task holds one open batch per target
    partition and its writes overlap its reading."""
    writer = spec.connection.secure(SequencedPartitionWriter(spec.connection.bootstrap, identity))
    message = Written(identity.producer_id, identity.producer_epoch, slot)
    transactional = add_partitions is not None
    senders: dict[TopicPartition, SlotSender] = {}

    together = BatchesTogether(writer)

    def open_senders(tps: Iterable[TopicPartition]) -> None:
        new = sorted(tp for tp in set(tps) if tp not in senders)
        if not new:
            return
        if add_partitions is not None:
            add_partitions(new)
        senders.update(
            open_slot_senders(writer, new, spec, slot=slot, transactional=transactional)
        )

    batch_index: dict[TopicPartition, int] = {}

    def written(tp: TopicPartition, batch: list[dict[str, Any]]) -> None:
        key = (tp.topic, tp.partition)
        message.records[key] = message.records.get(key, 0) + len(batch)
        planted_fault.after_written(message.total)
        if after_batch is not None:
            index = batch_index[tp] = batch_index.get(tp, -1) + 1
            after_batch(tp, index)

    def send(tp: TopicPartition, batch: list[dict[str, Any]]) -> None:
        open_senders([tp])
        senders[tp].send(batch)
        written(tp, batch)

    def send_together(items: list[tuple[TopicPartition, list[dict[str, Any]]]]) -> None:
        """Batches of distinct partitions in one request per leader node."""
        open_senders(tp for tp, _ in items)
        planned = [(tp, batch, senders[tp].plan(batch)) for tp, batch in items]
        outcomes = iter(together.send([p for _, _, p in planned if p is not None]))
        for tp, batch, plan in planned:
            if plan is not None:
                senders[tp].settle(plan, next(outcomes))
            written(tp, batch)

    try:
        if spec.sort:
            targets = group_rows(rows, spec, writer)
            if add_partitions is not None and targets:
                add_partitions(sorted(targets))
            if targets:
                senders.update(
                    open_slot_senders(
                        writer, sorted(targets), spec, slot=slot, transactional=transactional
                    )
                )
            cut = {tp: list(batches(targets[tp], spec)) for tp in sorted(targets)}
            # The i-th batch of every partition in one round: a request per node each.
            for i in range(max((len(b) for b in cut.values()), default=0)):
                send_together([(tp, b[i]) for tp, b in cut.items() if i < len(b)])
        else:
            _stream(rows, spec, RowTargets(spec, writer), send, send_together)
        message.duplicate_batches = sum(s.duplicates for s in senders.values())
        message.skipped_batches = sum(s.skipped for s in senders.values())
        return message
    finally:
        writer.close()


def _stream(
    rows: Iterable[Any],
    spec: TaskWriteSpec,
    target: RowTargets,
    send: Callable[[TopicPartition, list[dict[str, Any]]], None],
    send_together: Callable[[list[tuple[TopicPartition, list[dict[str, Any]]]]], None],
) -> None:
    """Cut each target partition's records into batches as they come (the cut of
    ``cut_batches``, per partition, so every attempt over the same input order cuts the
    same batches) and send each as soon as it is cut; the last batches of all partitions
    together."""
    open_batches: dict[TopicPartition, list[dict[str, Any]]] = {}
    sizes: dict[TopicPartition, int] = {}
    for row in rows:
        tp, record = target(row)
        length = (
            RECORD_OVERHEAD_BYTES + len(record.get("key") or "") + len(record.get("value") or "")
        )
        batch = open_batches.setdefault(tp, [])
        if batch and (
            len(batch) >= spec.batch_records or sizes[tp] + length > spec.batch_bytes
        ):
            send(tp, batch)
            batch = open_batches[tp] = []
            sizes[tp] = 0
        batch.append(record)
        sizes[tp] = sizes.get(tp, 0) + length
    send_together([(tp, batch) for tp, batch in open_batches.items() if batch])


def check_written(
    connection: Connection, identity: ProducerIdentity, messages: Iterable[Written]
) -> None:
    """Before a commit: every (partition, slot) a task wrote holds exactly its records
    (a batch missing would commit part of a task's output; more, a second copy), all under
    the transaction's producer id and epoch. The nodes are asked once each, for all their
    (partition, slot) pairs (``last_sequences``)."""
    claims: list[tuple[SlotKey, int]] = []
    for message in messages:
        if message.skipped or not message.records:
            continue
        if (message.producer_id, message.producer_epoch) != (
            identity.producer_id, identity.producer_epoch
        ):
            raise RuntimeError(
                f"a task wrote under producer {message.producer_id} epoch "
                f"{message.producer_epoch}, the transaction is {identity}; not committing"
            )
        for (topic, partition), count in message.records.items():
            claims.append(((TopicPartition(topic, partition), message.slot), count))
    if not claims:
        return
    probe = connection.secure(SequencedPartitionWriter(connection.bootstrap, identity))
    try:
        found = probe.last_sequences(key for key, _ in claims)
    finally:
        probe.close()
    for (tp, slot), count in claims:
        last = found[(tp, slot)]
        if last != count - 1:
            raise RuntimeError(
                f"{tp.topic}-{tp.partition} slot {slot}: {count} records written, "
                f"the node has sequences up to {last}; not committing"
            )


def idempotent_identity(connection: Connection) -> ProducerIdentity:
    """A new idempotent producer id for one at-least-once task (``POST /v1/producers``),
    asked with the connection's credentials."""
    return request_producer_id(connection.secure(PartitionFetcher(connection.bootstrap, None)))


def task_slot() -> int:
    """The running task's slot: its Spark partition id (the same for every attempt)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.partitionId())
