"""``df.write.format("eos")``: the whole DataFrame in one transaction owned by the driver.

PySpark builds the writer once, on the driver, pickles it into every task and, once the
tasks are done, unpickles it again on the driver for ``commit`` or ``abort``. So the
writer's constructor is the driver's "begin" and its fields carry the transaction to the
tasks:

1. ``EosBatchWriter.__init__`` (driver) checks the target topic exists and takes a new
   epoch for the write's transactional id (``transactionalId``, else a fresh
   ``eos-spark-write-<uuid>``): any task of an earlier write under that id still running
   is fenced, and what it left open is aborted.
2. ``write`` (each task) adds the partitions it writes to the transaction and produces its
   rows under the driver's producer id and epoch, in its own slot
   (``spark_jobs.datasource.task_write``): a retried or speculative attempt re-sends the
   same batches with the same sequences, which the node drops as duplicates.
3. ``commit`` (driver) checks that every (partition, slot) holds exactly what its task
   reported, then commits: read_committed readers see the whole DataFrame at once.
   ``abort`` (driver, when a task failed for good) aborts: nothing becomes visible. If the
   driver dies, the transaction times out (``transactionTimeoutMs``) and is aborted.

``writeOnce=true`` (with ``transactionalId``) is for ``foreachBatch``, where Spark replays
a micro-batch whose commit log it did not write and a plain batch write would add a
second copy: the commit also records the write (a transactional offset commit of the
group ``<transactionalId>``, entry ``<transactionalId>``-0), so rows and record become
visible together, and a later writer of the same ``transactionalId`` that finds the
record writes nothing. Give each micro-batch its own id (``f"{query}-{batch_id}"``).

``sendOffsets`` with ``sendOffsetsGroupId`` commits source offsets for that group in the
same transaction (a batch consume-transform-produce job, as ``spark_jobs.writer.write_atomic``
runs it for ``eos spark run``): the output and the input's new offsets become visible
together, and an empty output still moves the offsets.

``mode=at_least_once`` skips the transaction: each task writes idempotently under a
producer id of its own, visible as soon as written.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from sdk import Consumer, TopicPartition
from spark_jobs._wire import ProducerIdentity, TransactionSession
from spark_jobs.datasource.options import EosOptionError, SinkOptions
from spark_jobs.datasource.records import check_write_schema
from spark_jobs.datasource.task_write import (
    AfterBatch,
    TaskWriteSpec,
    Written,
    check_written,
    idempotent_identity,
    rows_of,
    task_slot,
    write_task,
)


def task_spec(options: SinkOptions, schema: Any) -> TaskWriteSpec:
    """Check the DataFrame's schema and the default topic (driver); what the tasks need."""
    binary = check_write_schema(schema, options.topic)
    if options.topic is not None:
        with options.connection.admin() as admin:
            names = {t.name for t in admin.describe_cluster().topics}
        if options.topic not in names:
            raise EosOptionError(f"option topic: {options.topic} does not exist")
    return TaskWriteSpec(
        connection=options.connection,
        default_topic=options.topic,
        binary=binary,
        batch_records=options.batch_records,
        batch_bytes=options.batch_bytes,
        sort=options.sort_within_task,
    )


def session(options: SinkOptions, transactional_id: str) -> TransactionSession:
    connection = options.connection
    return connection.secure(
        TransactionSession(
            connection.bootstrap, transactional_id,
            transaction_timeout_ms=options.transaction_timeout_ms,
        )
    )


def adder(options: SinkOptions, transactional_id: str, identity: ProducerIdentity) -> Any:
    """A task's ``add_partitions``: the driver's transaction, under its producer id and
    epoch (any process holding them may add partitions; KIP-890's check at the node)."""

    def add(partitions: Sequence[TopicPartition]) -> None:
        txn = session(options, transactional_id)
        try:
            txn.identity = identity
            txn.add_partitions(partitions)
        finally:
            txn.close()

    return add


def send_offsets(options: SinkOptions) -> dict[TopicPartition, int]:
    """The ``sendOffsets`` option as the transaction's offsets (none: empty)."""
    return {
        TopicPartition(topic, partition): offset
        for topic, parts in (options.send_offsets or {}).items()
        for partition, offset in parts.items()
    }


def written_before(options: SinkOptions, transactional_id: str) -> bool:
    """``writeOnce``: a write under ``transactional_id`` committed, with its record (read
    stably: a commit under way is waited for)."""
    connection = options.connection
    entry = TopicPartition(transactional_id, 0)
    with Consumer(
        connection.bootstrap, transactional_id, token=connection.token,
        ca_file=connection.ca_file,
    ) as consumer:
        found = consumer.committed([entry], require_stable=True)
    return found.get(entry) is not None


class EosBatchWriter(DataSourceArrowWriter):
    """One DataFrame, one transaction (see the module docstring); its tasks get their
    rows as Arrow record batches."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        self.spec = task_spec(options, schema)
        self.transactional_id = options.transactional_id or f"eos-spark-write-{uuid.uuid4().hex}"
        self.identity: ProducerIdentity | None = None
        self.done = options.write_once and written_before(options, self.transactional_id)
        #: Called in a task after each batch it wrote or skipped (partition, batch index):
        #: a test seam (a fault at a chosen point) set by ``write_atomic``'s caller.
        self.after_batch: AfterBatch | None = None
        if options.exactly_once and not self.done:
            txn = session(options, self.transactional_id)
            try:
                self.identity = txn.init()
            finally:
                txn.close()

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.write_rows(rows_of(iterator))

    def write_rows(self, rows: Iterable[Any]) -> Written:
        """A task's write of its rows (dicts, or ``Row`` objects): what ``write`` does with
        the task's Arrow batches, and ``write_atomic``'s tasks with an RDD's rows."""
        slot = task_slot()
        if self.done:  # writeOnce, and this write committed before: a replay
            return Written(None, None, slot, skipped=True)
        if self.identity is None:  # at-least-once: a producer id of the task's own
            identity = idempotent_identity(self.options.connection)
            return write_task(rows, self.spec, identity, slot=None,
                              add_partitions=None, after_batch=self.after_batch)  # fmt: skip
        return write_task(
            rows, self.spec, self.identity, slot=slot,
            add_partitions=adder(self.options, self.transactional_id, self.identity),
            after_batch=self.after_batch,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.identity is None:
            return
        written = [m for m in messages if isinstance(m, Written)]
        txn = session(self.options, self.transactional_id)
        try:
            txn.identity = self.identity
            try:
                check_written(self.options.connection, self.identity, written)
                offsets = send_offsets(self.options)
                if not any(m.records for m in written) and not offsets:
                    with contextlib.suppress(Exception):  # nothing was begun to commit
                        txn.abort()
                    return
                if offsets:
                    assert self.options.send_offsets_group_id is not None
                    txn.add_offsets(self.options.send_offsets_group_id, offsets)
                if self.options.write_once:
                    entry = TopicPartition(self.transactional_id, 0)
                    txn.add_offsets(self.transactional_id, {entry: 1})
                txn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    txn.abort()
                raise
        finally:
            txn.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.identity is None:
            return
        txn = session(self.options, self.transactional_id)
        try:
            txn.identity = self.identity
            with contextlib.suppress(Exception):
                txn.abort()
        finally:
            txn.close()
