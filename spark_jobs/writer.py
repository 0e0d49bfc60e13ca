"""Atomic DataFrame write: read_committed consumers see all of a DataFrame or none of it.

Spark retries failed tasks and may run two attempts of one task at once (speculation), so
a write made of independent per-task transactions could commit a partial result, or commit
one task's output twice. ``write_atomic`` makes the whole write one transaction, owned by
the driver, and it is the write of ``df.write.format("eos")`` (``spark_jobs.datasource``),
called from Python so that the caller gets what was written back:

1. The driver builds the data source's ``EosBatchWriter``: it checks the DataFrame's
   columns and the topic, and takes a new epoch for ``transactional_id`` (``init``: any
   task of an earlier write under that id still running is fenced, what it left open is
   aborted).
2. Each task writes its rows with the writer's ``write_rows`` (what a data source's task
   runs on its Arrow batches): sorted by content, numbered in the task's own slot, so a
   retried or speculative attempt re-sends the same batches with the same sequences,
   which the node drops as duplicates. Nothing is written twice.
3. When every task succeeded, the driver's ``commit`` checks that each (partition, slot)
   holds exactly what its task reported, adds the source offsets (if the write consumed a
   topic: the data source's ``sendOffsets``) and commits. If the job fails, it aborts:
   nothing of the write becomes visible.

The DataFrame must be deterministic (same rows per Spark partition on recomputation):
cache or checkpoint one computed from a random or changing source. Records without a key
and without a ``partition`` column go to ``murmur2(value)`` so that their placement is
deterministic too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eos_protocol.partitioning import keyed_partition
from sdk._types import TopicPartition
from spark_jobs.datasource.batch_write import EosBatchWriter
from spark_jobs.datasource.options import Connection, SinkOptions
from spark_jobs.datasource.task_write import AfterBatch, Written

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["AfterBatch", "WriteOptions", "WriteResult", "default_partition", "write_atomic"]


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


def write_atomic(
    df: DataFrame,
    bootstrap_url: str,
    transactional_id: str,
    *,
    topic: str | None = None,
    source_offsets: Mapping[TopicPartition, int] | None = None,
    group_id: str | None = None,
    transaction_timeout_ms: int = 300_000,
    options: WriteOptions | None = None,
    after_batch: AfterBatch | None = None,
    token: str | None = None,
    ca_file: str | None = None,
) -> WriteResult:
    """Write ``df`` to ``topic`` (or to each row's ``topic`` column) in one transaction.

    Columns: ``value`` (required), ``key``, ``partition``, ``headers`` (a map of strings,
    or Kafka's array of key/value pairs) and, without ``topic=``, ``topic``; a key or value
    that is neither text nor bytes is written as text. ``source_offsets`` (next offsets
    to read) are committed for ``group_id`` in the same transaction. Raises if the job
    fails, after aborting; the transaction timeout must cover the whole job.
    """
    if topic is None and "topic" not in df.columns:
        raise ValueError("pass topic= or give the DataFrame a 'topic' column")
    if source_offsets and group_id is None:
        raise ValueError("source_offsets need a group_id")
    options = options or WriteOptions()
    offsets: dict[str, dict[int, int]] = {}
    for tp, offset in (source_offsets or {}).items():
        offsets.setdefault(tp.topic, {})[tp.partition] = offset
    sink = SinkOptions(
        connection=Connection(bootstrap_url, token, ca_file),
        topic=topic,
        transactional_id=transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        batch_records=options.batch_records,
        batch_bytes=options.batch_bytes,
        send_offsets=offsets or None,
        send_offsets_group_id=group_id if offsets else None,
    )
    shaped = _text_keys_and_values(df)
    writer = EosBatchWriter(sink, shaped.schema)
    writer.after_batch = after_batch
    try:
        messages: list[Written] = shaped.rdd.mapPartitions(_task(writer)).collect()
    except BaseException:
        with contextlib.suppress(Exception):
            writer.abort([])
        raise
    writer.commit(list(messages))  # aborts, and raises, if it cannot commit
    return _result(writer, messages)


def _text_keys_and_values(df: DataFrame) -> DataFrame:
    """``df`` with a key or value column that is neither text nor bytes cast to text (the
    sink takes those two kinds only)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    kinds = {f.name: f.dataType for f in df.schema.fields}
    cast = [
        name for name in ("key", "value")
        if name in kinds and not isinstance(kinds[name], StringType | BinaryType)
    ]  # fmt: skip
    for name in cast:
        df = df.withColumn(name, F.col(name).cast("string"))
    return df


def _task(writer: EosBatchWriter) -> Callable[[Iterable[Any]], Iterator[Written]]:
    """A task's half: the data source's write of the task's rows; its commit message goes
    back to the driver as the task's one element. (The rows come as ``Row`` objects:
    ``mapInArrow`` would hand over Arrow batches, but PySpark asks pandas of it.)"""

    def run(rows: Iterable[Any]) -> Iterator[Written]:
        yield writer.write_rows(rows)

    return run


def _result(writer: EosBatchWriter, messages: list[Written]) -> WriteResult:
    identity = writer.identity
    assert identity is not None  # an exactly-once write always has its producer
    result = WriteResult(writer.transactional_id, identity.producer_id, identity.producer_epoch)
    for message in messages:
        for (name, partition), count in message.records.items():
            tp = TopicPartition(name, partition)
            result.records[tp] = result.records.get(tp, 0) + count
        result.duplicate_batches += message.duplicate_batches
        result.skipped_batches += message.skipped_batches
    return result
