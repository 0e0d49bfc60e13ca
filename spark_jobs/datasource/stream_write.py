"""``df.writeStream.format("eos")``: every micro-batch in one transaction, exactly once.

Spark's own Kafka sink is at-least-once: a Kafka transaction belongs to one producer, so
the tasks of a micro-batch cannot share one, and a batch replayed after a driver failure is
written again (SPARK-28908 was closed for that reason). In EOS several processes may write
under one producer id and epoch, each in a sequence space of its own (a *slot*), and the
driver that owns the id commits or aborts for all of them. So here:

* **One transaction per micro-batch**, transactional id ``<transactionalIdPrefix>-<batchId>``.
  The prefix is an option the user must give and keep for the life of the query (Spark
  has no stable query identity a sink can see: the query id lives in the checkpoint, which
  the sink cannot read, and ``queryName`` is optional and not unique).
* **The batch id is recorded inside the transaction**: ``commit(N)`` adds a transactional
  offset commit for the group ``<prefix>`` (entry ``<prefix>``-0) holding N+1, so the
  record and the batch's records become visible together, or neither does.
* **Preparing a batch** (driver): PySpark builds this writer, per micro-batch, in the
  planner, and pickles it exactly then, to ship it to the batch's tasks; ``commit`` and
  ``abort`` run in another process, on a writer that is never pickled. So pickling is the
  one driver-side moment before the tasks of each batch: ``__getstate__`` reads the
  recorded L (the first batch not yet committed) and takes a new epoch for
  ``<prefix>-L`` (``init``), which aborts whatever an earlier run left open under that id
  and fences its tasks. Spark then runs batch L, or L-1 if the driver died after the EOS
  commit of L-1 and before Spark's commit log (a replay).
* **Tasks** (batch N from the local property ``streaming.sql.batchId``) read the record:
  N < L means the batch is already committed, and the task writes nothing; otherwise it
  looks the transaction of ``<prefix>-N`` up at the coordinator (producer id, epoch,
  state), adds its partitions and writes its rows in slot = its partition id
  (``task_write``). A retried or speculative attempt re-sends the same batches with the
  same sequences: duplicates. A zombie task of batch N cannot write into batch N+1: its
  transactional id is another, and the epoch it holds was fenced or its transaction ended.
* ``commit(messages, N)``: nothing if the record says N is committed (the replay);
  otherwise the driver checks every (partition, slot) holds exactly what its task
  reported, adds the record N+1 and commits. ``abort(messages, N)`` takes a new epoch for
  ``<prefix>-N``, which aborts the transaction and fences every task still writing.

If the driver dies while tasks write, or after they wrote and before the commit, the open
transaction is aborted by the restarted query's first preparation (or by its timeout) and
the batch is written again from Spark's offset log; if it dies after the EOS commit and
before Spark's commit log, the replayed batch writes nothing. Either way each row of each
micro-batch is visible exactly once to read_committed readers.

``mode=at_least_once`` writes each task idempotently, without a transaction (the
benchmark's baseline): a retried task or a replayed batch writes its rows again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from eos_protocol.states import TransactionState
from sdk import Consumer, TopicPartition
from spark_jobs._wire import ProducerIdentity
from spark_jobs.datasource.batch_write import adder, session, task_spec
from spark_jobs.datasource.options import SinkOptions
from spark_jobs.datasource.task_write import (
    Written,
    check_written,
    idempotent_identity,
    rows_of,
    task_slot,
    write_task,
)

#: The local property in which Spark tells a task its micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"

#: States in which a batch's transactional id takes writes: its epoch is current and no
#: transaction of it is ending. After ``init`` the state is Empty, or CompleteAbort when
#: the init aborted what a dead run left open; the tasks' first add begins the transaction.
_OPEN = frozenset(
    {TransactionState.EMPTY, TransactionState.ONGOING, TransactionState.COMPLETE_ABORT}
)

#: Test seam: ``EOS_SPARK_TEST_KILL_AT`` names a point of ``commit`` (``after_tasks``:
#: every task wrote, the EOS commit not sent; ``after_eos_commit``: committed, Spark's
#: commit log not written) at which the driver dies, and ``EOS_SPARK_TEST_KILL_MARKER`` a
#: file written just before, so a test can show the point was hit. Unset: nothing happens.
KILL_AT_ENV, KILL_MARKER_ENV = "EOS_SPARK_TEST_KILL_AT", "EOS_SPARK_TEST_KILL_MARKER"

#: How long a task waits for a batch's transactional id to settle (an abort under way).
SETTLE_TIMEOUT_S = 30.0


def transactional_id(prefix: str, batch_id: int) -> str:
    return f"{prefix}-{batch_id}"


def record_entry(prefix: str) -> TopicPartition:
    """Where the group ``prefix`` keeps the next batch id to write."""
    return TopicPartition(prefix, 0)


def next_batch(options: SinkOptions) -> int | None:
    """The first micro-batch not committed yet (None: the query never committed one).
    Waits while a commit that records it is under way (read stably, KIP-447)."""
    prefix = options.transactional_id_prefix
    assert prefix is not None
    connection = options.connection
    with Consumer(
        connection.bootstrap, prefix, token=connection.token, ca_file=connection.ca_file
    ) as consumer:
        found = consumer.committed([record_entry(prefix)], require_stable=True)
    entry = found.get(record_entry(prefix))
    return None if entry is None else int(entry.offset)


def prepare(options: SinkOptions) -> int:
    """A new epoch for the transaction of the first uncommitted batch; returns its id."""
    prefix = options.transactional_id_prefix
    assert prefix is not None
    for _ in range(10):
        batch = next_batch(options) or 0
        txn = session(options, transactional_id(prefix, batch))
        try:
            txn.init()
        finally:
            txn.close()
        if (next_batch(options) or 0) == batch:
            return batch
    raise RuntimeError(f"{prefix}: the committed batch keeps moving; is another query "
                       "writing with this transactionalIdPrefix?")  # fmt: skip


def open_identity(options: SinkOptions, batch_id: int) -> ProducerIdentity:
    """The producer id and epoch of a prepared batch's open transaction."""
    prefix = options.transactional_id_prefix
    assert prefix is not None
    tid = transactional_id(prefix, batch_id)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    with options.connection.admin() as admin:
        while True:
            try:
                txn = admin.describe_transaction(tid)
            except Exception as exc:
                raise RuntimeError(f"{tid}: the transaction of batch {batch_id} was not "
                                   f"prepared ({exc})") from exc  # fmt: skip
            if not txn.state.is_prepare or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    if txn.state not in _OPEN:
        raise RuntimeError(f"{tid}: the transaction of batch {batch_id} is {txn.state}, "
                           "not ready for the batch's tasks")  # fmt: skip
    return ProducerIdentity(txn.producer_id, txn.producer_epoch)


def _test_kill_point(point: str, batch_id: int) -> None:
    """The test seam (``KILL_AT_ENV``): SIGKILL the driver's process group, not only this
    process: PySpark runs ``commit`` in a Python worker of the driver's JVM, whose daemon
    has a group of its own. A test starts its driver in a session of its own, so the
    session id names the driver's group; this process's group follows."""
    if os.environ.get(KILL_AT_ENV) != point:
        return
    marker = os.environ.get(KILL_MARKER_ENV)
    if marker:
        with open(marker, "w") as out:
            out.write(f"{point} {batch_id}\n")
    os.killpg(os.getsid(0), signal.SIGKILL)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def batch_of_task() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
    if value is None:
        raise RuntimeError(f"no {BATCH_ID_PROPERTY} in the task: not a micro-batch write")
    return int(value)


class EosStreamWriter(DataSourceStreamArrowWriter):
    """The exactly-once (or at-least-once) micro-batch sink (see the module docstring);
    its tasks get their rows as Arrow record batches."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        self.spec = task_spec(options, schema)
        self.prepared: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Shipping the writer to a micro-batch's tasks: prepare the batch first."""
        if self.options.exactly_once and self.prepared is None:
            self.prepared = prepare(self.options)
        return dict(self.__dict__)

    # --- tasks ---------------------------------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        slot = task_slot()
        if not self.options.exactly_once:
            identity = idempotent_identity(self.options.connection)
            return write_task(rows_of(iterator), self.spec, identity, slot=None,
                              add_partitions=None)  # fmt: skip
        batch = batch_of_task()
        recorded = next_batch(self.options)
        prefix = self.options.transactional_id_prefix
        assert prefix is not None
        if recorded is not None and recorded > batch:
            if recorded > batch + 1:
                raise RuntimeError(
                    f"transactionalIdPrefix {prefix} has committed batches up to "
                    f"{recorded - 1}, but this query is at batch {batch}: a prefix belongs "
                    "to one query and its checkpoint; give a new query a new prefix"
                )
            return Written(None, None, slot, skipped=True)  # the replay of a committed batch
        if recorded is None and batch > 0:
            raise RuntimeError(
                f"transactionalIdPrefix {prefix} has no committed batch, but this query is "
                f"at batch {batch}: the prefix of a running query must not change"
            )
        identity = open_identity(self.options, batch)
        return write_task(
            rows_of(iterator), self.spec, identity, slot=slot,
            add_partitions=adder(self.options, transactional_id(prefix, batch), identity),
        )

    # --- driver --------------------------------------------------------------------------

    def _open_batch_prefix(self, batch_id: int) -> str | None:
        """The prefix, when ``batch_id`` is an exactly-once batch not committed yet; None
        when there is nothing to commit or abort (at-least-once, or a batch committed
        before the driver died, which Spark replays only to log it)."""
        if not self.options.exactly_once:
            return None
        prefix = self.options.transactional_id_prefix
        assert prefix is not None
        recorded = next_batch(self.options)
        return None if recorded is not None and recorded > batch_id else prefix

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        prefix = self._open_batch_prefix(batchId)
        if prefix is None:
            return
        identity = open_identity(self.options, batchId)
        written = [m for m in messages if isinstance(m, Written)]
        txn = session(self.options, transactional_id(prefix, batchId))
        try:
            txn.identity = identity
            check_written(self.options.connection, identity, written)
            _test_kill_point("after_tasks", batchId)
            txn.add_offsets(prefix, {record_entry(prefix): batchId + 1})
            txn.commit()
            _test_kill_point("after_eos_commit", batchId)
        finally:
            txn.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        prefix = self._open_batch_prefix(batchId)
        if prefix is None:
            return
        txn = session(self.options, transactional_id(prefix, batchId))
        try:
            with contextlib.suppress(Exception):
                txn.init()  # a new epoch: the batch's transaction aborted, its tasks fenced
        finally:
            txn.close()
