"""Atomic DataFrame write: read_committed consumers see all of a DataFrame or none of it.

Spark retries failed tasks and may run two attempts of one task at once (speculation), so
a write made of independent per-task transactions could commit a partial result, or commit
one task's output twice. Here the whole write is one transaction, owned by the driver:

1. The driver takes a new epoch for the write's transactional id (``init``: any task of an
   earlier write still running is fenced) and adds every partition of the target topics.
2. The DataFrame is repartitioned by target partition, so exactly one Spark task owns each
   target partition, and sorted within it by the records' content, so every attempt of
   that task sees the same records in the same order.
3. A task numbers its records from sequence 0 per target partition and cuts them into
   batches the same way each time, producing under the driver's producer id and epoch. A
   retried or speculative attempt sends batches with the very same sequences, which the
   node answers as duplicates (or, if they are older than the node remembers, the attempt
   learns from the node that they are written and skips them). Nothing is written twice.
4. When every task succeeded, the driver checks that each partition holds exactly the
   sequences it expects, adds the source offsets (if the write consumed a topic) and
   commits. If the job fails, it aborts: nothing of the write becomes visible.

The DataFrame must be deterministic (same rows on recomputation): cache or checkpoint one
computed from a random or changing source. Records without a key and without a
``partition`` column go to ``murmur2(value)`` so that their placement is deterministic too.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eos_protocol.errors import OutOfOrderSequenceNumberError
from eos_protocol.partitioning import keyed_partition
from sdk._types import TopicPartition
from spark_jobs._wire import ProducerIdentity, SequencedPartitionWriter, TransactionSession

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Called by a task after each batch it wrote or skipped: (partition, batch index). A test
#: seam (a fault on the first attempt) and a progress hook.
AfterBatch = Callable[[TopicPartition, int], None]


def default_partition(key: str | None, value: str | None, partitions: int) -> int:
    """Kafka's placement for keyed records (murmur2 of the key); keyless ones by value."""
    basis = key if key is not None else (value or "")
    return keyed_partition(basis, partitions)


@dataclass(frozen=True)
class WriteOptions:
    """How tasks cut their records into batches (the same cut on every attempt)."""

    batch_records: int = 2000
    batch_bytes: int = 1024 * 1024


@dataclass
class WriteResult:
    """What one atomic write did."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    records: dict[TopicPartition, int] = field(default_factory=dict)
    duplicate_batches: int = 0
    skipped_batches: int = 0

    @property
    def total(self) -> int:
        return sum(self.records.values())


def cut_batches(
    records: Iterable[dict[str, Any]], batch_records: int, batch_bytes: int, overhead: int = 64
) -> Iterator[list[dict[str, Any]]]:
    """The deterministic cut of a task's records for one partition: a batch closes at
    ``batch_records`` records or before it would pass ``batch_bytes`` of keys and values
    (each counted with ``overhead``), so every attempt of a task cuts the same batches and
    numbers them with the same sequences (the data source's tasks too,
    ``spark_jobs.datasource.task_write``)."""
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


def write_partition(
    writer: SequencedPartitionWriter,
    tp: TopicPartition,
    records: Iterable[dict[str, Any]],
    options: WriteOptions,
    after_batch: AfterBatch | None = None,
) -> tuple[int, int, int]:
    """Write one target partition's records (already in their deterministic order) from
    sequence 0; returns (records, duplicate batches, skipped batches)."""
    written = writer.last_sequence(tp)
    sequence = count = duplicates = skipped = 0
    for index, batch in enumerate(
        cut_batches(records, options.batch_records, options.batch_bytes)
    ):
        last = sequence + len(batch) - 1
        if last <= written:
            skipped += 1
        else:
            try:
                if writer.produce(tp, sequence, batch).duplicate:
                    duplicates += 1
            except OutOfOrderSequenceNumberError:
                # Another attempt of this task is ahead of us by more batches than the node
                # remembers: if it wrote this batch (it is the same batch), skip it.
                written = writer.last_sequence(tp)
                if last > written:
                    raise
                skipped += 1
        sequence = last + 1
        count += len(batch)
        if after_batch is not None:
            after_batch(tp, index)
    return count, duplicates, skipped


def _write_task(
    bootstrap_url: str,
    identity: ProducerIdentity,
    targets: Sequence[TopicPartition],
    options: WriteOptions,
    after_batch: AfterBatch | None,
) -> Callable[[Iterable[Any]], Iterator[tuple[str, int, int, int, int]]]:
    def run(rows: Iterable[Any]) -> Iterator[tuple[str, int, int, int, int]]:
        writer = SequencedPartitionWriter(bootstrap_url, identity)
        try:
            for slot, group in itertools.groupby(rows, key=lambda row: row["_slot"]):
                tp = targets[slot]
                records = (_wire_record(row) for row in group)
                count, dup, skip = write_partition(writer, tp, records, options, after_batch)
                yield tp.topic, tp.partition, count, dup, skip
        finally:
            writer.close()

    return run


def _wire_record(row: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"key": row["key"], "value": row["value"]}
    headers = row["headers"]
    if headers:
        record["headers"] = dict(headers)
    return record


def _prepared(
    df: DataFrame, topic: str | None, targets: list[TopicPartition], counts: Mapping[str, int]
) -> DataFrame:
    """Columns ``_slot, key, value, headers``: one Spark partition per target partition
    (hash partitioning on the slot puts every slot in exactly one), sorted by content."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, MapType, StringType

    columns = set(df.columns)
    topic_col = F.lit(topic) if topic is not None else F.col("topic")
    key_col = F.col("key").cast("string") if "key" in columns else F.lit(None).cast("string")
    headers_col = (
        F.col("headers")
        if "headers" in columns
        else F.lit(None).cast(MapType(StringType(), StringType()))
    )
    slots = {(tp.topic, tp.partition): i for i, tp in enumerate(targets)}
    given = "partition" in columns

    def slot(topic_name: str, key: str | None, value: str | None, partition: int | None) -> int:
        if partition is None:
            partition = default_partition(key, value, counts[topic_name])
        return slots[(topic_name, partition)]

    slot_udf = F.udf(slot, IntegerType(), useArrow=False)
    partition_col = F.col("partition").cast("int") if given else F.lit(None).cast("int")
    shaped = df.select(
        slot_udf(topic_col, key_col, F.col("value").cast("string"), partition_col).alias("_slot"),
        key_col.alias("key"),
        F.col("value").cast("string").alias("value"),
        headers_col.alias("headers"),
    )
    return shaped.repartition(len(targets), "_slot").sortWithinPartitions(
        "_slot", "key", "value", F.array_sort(F.map_entries("headers"))
    )


def write_atomic(
    df: DataFrame,
    bootstrap_url: str,
    transactional_id: str,
    *,
    topic: str | None = None,
    topics: Sequence[str] | None = None,
    source_offsets: Mapping[TopicPartition, int] | None = None,
    group_id: str | None = None,
    transaction_timeout_ms: int = 300_000,
    options: WriteOptions | None = None,
    after_batch: AfterBatch | None = None,
) -> WriteResult:
    """Write ``df`` to ``topic`` (or to each row's ``topic`` column) in one transaction.

    Columns: ``value`` (required), ``key``, ``partition``, ``headers`` (map of strings) and,
    without ``topic=``, ``topic`` (pass ``topics=`` to spare a job finding them).
    ``source_offsets`` (next offsets to read) are committed for ``group_id`` in the same
    transaction. Raises if the job fails, after aborting; the transaction timeout must
    cover the whole job.
    """
    if topic is None and "topic" not in df.columns:
        raise ValueError("pass topic= or give the DataFrame a 'topic' column")
    if source_offsets and group_id is None:
        raise ValueError("source_offsets need a group_id")
    options = options or WriteOptions()
    if topic is not None:
        names = [topic]
    elif topics is not None:
        names = sorted(set(topics))
    else:
        names = sorted({row["topic"] for row in df.select("topic").distinct().collect()})
    session = TransactionSession(
        bootstrap_url, transactional_id, transaction_timeout_ms=transaction_timeout_ms
    )
    try:
        return _run_write(
            df, session, bootstrap_url, topic, names, source_offsets, group_id, options,
            after_batch,
        )
    finally:
        session.close()


def _run_write(
    df: DataFrame,
    session: TransactionSession,
    bootstrap_url: str,
    topic: str | None,
    names: list[str],
    source_offsets: Mapping[TopicPartition, int] | None,
    group_id: str | None,
    options: WriteOptions,
    after_batch: AfterBatch | None,
) -> WriteResult:
    identity = session.init()
    probe = SequencedPartitionWriter(bootstrap_url, identity)
    try:
        counts = {name: probe.partition_count(name) for name in names}
        targets = [TopicPartition(n, p) for n in names for p in range(counts[n])]
        session.add_partitions(targets)
        try:
            prepared = _prepared(df, topic, targets, counts)
            task = _write_task(bootstrap_url, identity, targets, options, after_batch)
            outcome = prepared.rdd.mapPartitions(task).collect()
            result = WriteResult(session.transactional_id, *_identity(identity))
            for name, partition, count, dup, skip in outcome:
                result.records[TopicPartition(name, partition)] = count
                result.duplicate_batches += dup
                result.skipped_batches += skip
            _check_written(probe, result)
            if source_offsets:
                assert group_id is not None
                session.add_offsets(group_id, source_offsets)
            session.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                session.abort()
            raise
    finally:
        probe.close()
    return result


def _identity(identity: ProducerIdentity) -> tuple[int, int]:
    return identity.producer_id, identity.producer_epoch


def _check_written(probe: SequencedPartitionWriter, result: WriteResult) -> None:
    """Before committing: every partition's last sequence is its record count minus one,
    so no batch is missing (the write would commit a partial partition) or extra. Asked
    with one request per leader node (``last_sequences``), not one per partition."""
    found = probe.last_sequences((tp, None) for tp in result.records)
    for tp, count in result.records.items():
        last = found[(tp, None)]
        if last != count - 1:
            raise RuntimeError(
                f"{tp.topic}-{tp.partition}: {count} records expected, the node has "
                f"sequences up to {last}; not committing"
            )
