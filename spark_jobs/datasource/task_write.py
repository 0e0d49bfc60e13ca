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
  ``last_sequence(slot=)`` how far the slot got and skips those batches.

Nothing is ever written twice, and the commit message tells the driver how many records
each (partition, slot) must hold, which it checks before committing.

In at-least-once mode a task takes an idempotent producer id of its own and writes without
a transaction: a resent batch is a duplicate, a retried task writes its output again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from eos_protocol.errors import OutOfOrderSequenceNumberError
from sdk import TopicPartition
from spark_jobs._wire import (
    PartitionFetcher,
    ProducerIdentity,
    SequencedPartitionWriter,
    request_producer_id,
)
from spark_jobs.datasource import planted_fault
from spark_jobs.datasource.options import Connection
from spark_jobs.datasource.records import row_fields, sort_key, target_of, wire_record
from spark_jobs.writer import cut_batches

#: Bytes counted for a record beside its key and value (offsets, framing, JSON).
RECORD_OVERHEAD_BYTES = 48

AddPartitions = Callable[[Sequence[TopicPartition]], None]


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


def batches(
    records: Iterable[dict[str, Any]], spec: TaskWriteSpec
) -> Iterator[list[dict[str, Any]]]:
    """The deterministic cut of ``write_atomic`` (``spark_jobs.writer.cut_batches``)."""
    return cut_batches(records, spec.batch_records, spec.batch_bytes, RECORD_OVERHEAD_BYTES)


def group_rows(
    rows: Iterable[Any], spec: TaskWriteSpec, writer: SequencedPartitionWriter
) -> dict[TopicPartition, list[dict[str, Any]]]:
    """The task's rows as wire records per target partition, in writing order."""
    counts: dict[str, int] = {}
    targets: dict[TopicPartition, list[dict[str, Any]]] = {}
    for row in rows:
        fields = row_fields(row)
        record = wire_record(fields, spec.binary)
        topic = fields.get("topic") or spec.default_topic
        if topic is not None and topic not in counts:
            counts[topic] = writer.partition_count(topic)
        name, partition = target_of(fields, spec.default_topic, counts)
        targets.setdefault(TopicPartition(name, partition), []).append(record)
    if spec.sort:
        for records in targets.values():
            records.sort(key=sort_key)
    return targets


def write_slot(
    writer: SequencedPartitionWriter,
    tp: TopicPartition,
    records: Sequence[dict[str, Any]],
    spec: TaskWriteSpec,
    *,
    slot: int | None,
    transactional: bool,
    written_before: int = 0,
) -> tuple[int, int]:
    """Write one target partition's records from sequence 0 of ``slot``; returns
    (duplicate batches, skipped batches). ``written_before``: the task's records already
    written to other partitions (for the planted fault's count)."""
    encoding = "base64" if spec.binary else "utf8"
    written = writer.last_sequence(tp, slot=slot)
    sequence = duplicates = skipped = 0
    for batch in batches(records, spec):
        last = sequence + len(batch) - 1
        if last <= written:
            skipped += 1
        else:
            try:
                answer = writer.produce(
                    tp, sequence, batch, transactional=transactional, encoding=encoding,
                    slot=slot,
                )
                duplicates += int(answer.duplicate)
            except OutOfOrderSequenceNumberError:
                # Another attempt of this task is ahead by more batches than the node
                # remembers: if it wrote this batch (the same batch), skip it.
                written = writer.last_sequence(tp, slot=slot)
                if last > written:
                    raise
                skipped += 1
        sequence = last + 1
        planted_fault.after_written(written_before + sequence)
    return duplicates, skipped


def write_task(
    rows: Iterable[Any],
    spec: TaskWriteSpec,
    identity: ProducerIdentity,
    *,
    slot: int | None,
    add_partitions: AddPartitions | None,
) -> Written:
    """A task's whole output: grouped per target partition, the partitions added to the
    transaction (``add_partitions``; None: idempotent, not transactional), then written."""
    writer = spec.connection.secure(SequencedPartitionWriter(spec.connection.bootstrap, identity))
    try:
        targets = group_rows(rows, spec, writer)
        if add_partitions is not None and targets:
            add_partitions(sorted(targets))
        message = Written(identity.producer_id, identity.producer_epoch, slot)
        for tp in sorted(targets):
            dup, skip = write_slot(
                writer, tp, targets[tp], spec, slot=slot,
                transactional=add_partitions is not None, written_before=message.total,
            )
            message.records[(tp.topic, tp.partition)] = len(targets[tp])
            message.duplicate_batches += dup
            message.skipped_batches += skip
        return message
    finally:
        writer.close()


def check_written(
    connection: Connection, identity: ProducerIdentity, messages: Iterable[Written]
) -> None:
    """Before a commit: every (partition, slot) a task wrote holds exactly its records
    (a batch missing would commit part of a task's output; more, a second copy), all under
    the transaction's producer id and epoch."""
    probe = connection.secure(SequencedPartitionWriter(connection.bootstrap, identity))
    try:
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
                last = probe.last_sequence(TopicPartition(topic, partition), slot=message.slot)
                if last != count - 1:
                    raise RuntimeError(
                        f"{topic}-{partition} slot {message.slot}: {count} records written, "
                        f"the node has sequences up to {last}; not committing"
                    )
    finally:
        probe.close()


def idempotent_identity(connection: Connection) -> ProducerIdentity:
    """A new idempotent producer id for one at-least-once task (``POST /v1/producers``),
    asked with the connection's credentials."""
    return request_producer_id(connection.secure(PartitionFetcher(connection.bootstrap, None)))


def task_slot() -> int:
    """The running task's slot: its Spark partition id (the same for every attempt)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.partitionId())
