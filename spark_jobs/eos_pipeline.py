"""The exactly-once consume-transform-produce job on Spark (``eos spark run``).

Batch after batch, the driver plans an ``OffsetRange`` per source partition (from the
group's committed offset up to the last stable offset, at most ``max_batch_records``
long) and runs one Spark task per partition with work. The task that owns source
partition ``p``:

1. calls ``init`` for transactional id ``{application_id}-{topic}-{p}`` (InitProducerId,
   through ``spark_jobs._wire.TransactionSession``). The id is the same for every attempt
   of the task, and for the task of ``p`` in every batch and after a driver restart, so
   the init fences any earlier attempt still running (a retried task's predecessor, a
   speculative twin, a task of a dead driver) and aborts what it left open: a fenced
   attempt has no effect;
2. reads the group's committed offset with ``require_stable`` (now settled by the init),
   then the records read_committed from there up to the planned end
   (``spark_jobs.reader.RangeReader``, a fetch ahead);
3. writes the transform's output in numbered batches under the init's producer id and
   epoch (``spark_jobs.batch_writer``), waits for every batch's acknowledgement, adds the
   new offset (the planned end) to the transaction, and commits. Any failure aborts.

If the committed offset has reached the end already (an earlier attempt committed before
Spark retried it), the task does nothing. The group id is the application id. Batches
repeat until a plan finds nothing to read, or forever with ``follow``.

With a DataFrame transform the batch is instead read into a DataFrame, transformed, and
written by ``spark_jobs.writer.write_atomic`` with the source offsets in the same
transaction (transactional id ``{application_id}-{topic}-df``).

``transactional=False`` runs the same job at-least-once (a new idempotent producer id per
task, offsets committed after the output): the baseline of the benchmark, and what the
tests show duplicating output under the same faults.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sdk import Consumer, TopicPartition
from spark_jobs._wire import TransactionSession, init_producer_id
from spark_jobs.batch_writer import BatchOptions, BatchWriter
from spark_jobs.reader import OffsetRange, RangeReader, plan_ranges, read_ranges
from spark_jobs.transforms import DataFrameTransform, RecordTransform
from spark_jobs.writer import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class PipelineConfig:
    """Everything a run needs; it is shipped to the executors with each task."""

    bootstrap_url: str
    application_id: str
    source_topic: str
    transactional: bool = True
    max_batch_records: int | None = 100_000
    follow: bool = False
    poll_interval_s: float = 1.0
    transaction_timeout_ms: int = 120_000
    max_poll_records: int = 10_000
    write_batch_records: int = 10_000
    write_batch_bytes: int = 2 * 1024 * 1024

    @property
    def group_id(self) -> str:
        return self.application_id

    @property
    def batch_options(self) -> BatchOptions:
        return BatchOptions(self.write_batch_records, self.write_batch_bytes)

    def transactional_id(self, partition: int) -> str:
        return f"{self.application_id}-{self.source_topic}-{partition}"


@dataclass
class TaskProgress:
    """What a fault hook sees after each record a task sent (tests fail tasks here)."""

    tp: TopicPartition
    attempt: int
    records: int
    flush: Callable[[], None]


FaultHook = Callable[[TaskProgress], None]


@dataclass(frozen=True)
class PartitionOutcome:
    topic: str
    partition: int
    start: int
    end: int
    records_in: int
    records_out: int


@dataclass
class PipelineStats:
    batches: int = 0
    records_in: int = 0
    records_out: int = 0
    seconds: float = 0.0
    outcomes: list[PartitionOutcome] = field(default_factory=list)


def _attempt_number() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.attemptNumber())


def process_partition(
    config: PipelineConfig,
    planned: OffsetRange,
    transform: RecordTransform,
    fault: FaultHook | None = None,
) -> PartitionOutcome:
    """One source partition's share of a batch (the body of a Spark task)."""
    with fewer_collections():
        if config.transactional:
            return _process_exactly_once(config, planned, transform, fault)
        return _process_at_least_once(config, planned, transform, fault)


#: The young generation's threshold while a task copies (Python's default is 700).
TASK_GC_THRESHOLD = 100_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the young generation every 100,000 allocations instead of 700 while a task
    copies: a task allocates a few objects per record (the record, its dict, the output),
    none in cycles, and with the default threshold the collector's passes over them took
    a quarter of the task's CPU. Cycles are still collected, only less often; the worker
    (reused by the next task) gets its own setting back."""
    before = gc.get_threshold()
    gc.set_threshold(TASK_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _process_exactly_once(
    config: PipelineConfig,
    planned: OffsetRange,
    transform: RecordTransform,
    fault: FaultHook | None,
) -> PartitionOutcome:
    tp = planned.tp
    session = TransactionSession(
        config.bootstrap_url, config.transactional_id(tp.partition),
        transaction_timeout_ms=config.transaction_timeout_ms,
    )
    try:
        identity = session.init()  # fences every earlier attempt of this partition
        with Consumer(
            config.bootstrap_url, config.group_id, max_poll_records=config.max_poll_records
        ) as consumer:
            consumer.assign([tp])
            found = consumer.committed([tp], require_stable=True)[tp]
            start = planned.start if found is None else found.offset
            if start >= planned.end:
                return PartitionOutcome(tp.topic, tp.partition, start, planned.end, 0, 0)
            writer = BatchWriter(
                config.bootstrap_url, identity, add_partitions=session.add_partitions,
                options=config.batch_options,
            )
            try:
                count_in = _copy(config, planned, start, transform, writer, fault)
                writer.flush()  # every batch acknowledged before the commit
            except BaseException:
                writer.close()
                with contextlib.suppress(Exception):
                    session.abort()  # a fenced attempt's abort is refused: nothing to undo
                raise
            writer.close()
            session.add_offsets(config.group_id, {tp: planned.end})
            session.commit()
        return PartitionOutcome(
            tp.topic, tp.partition, start, planned.end, count_in, writer.records
        )
    finally:
        session.close()


def _process_at_least_once(
    config: PipelineConfig,
    planned: OffsetRange,
    transform: RecordTransform,
    fault: FaultHook | None,
) -> PartitionOutcome:
    tp = planned.tp
    with Consumer(
        config.bootstrap_url, config.group_id, max_poll_records=config.max_poll_records
    ) as consumer:
        consumer.assign([tp])
        found = consumer.committed([tp], require_stable=False)[tp]
        start = planned.start if found is None else found.offset
        if start >= planned.end:
            return PartitionOutcome(tp.topic, tp.partition, start, planned.end, 0, 0)
        writer = BatchWriter(
            config.bootstrap_url, init_producer_id(config.bootstrap_url),
            options=config.batch_options,
        )
        try:
            count_in = _copy(config, planned, start, transform, writer, fault)
            writer.flush()
        finally:
            writer.close()
        consumer.commit({tp: planned.end})
    return PartitionOutcome(tp.topic, tp.partition, start, planned.end, count_in, writer.records)


def _copy(
    config: PipelineConfig,
    planned: OffsetRange,
    start: int,
    transform: RecordTransform,
    writer: BatchWriter,
    fault: FaultHook | None,
) -> int:
    """Read ``[start, end)`` and hand what the transform makes to ``writer``; returns the
    records read. The loop without a fault hook is the hot path: nothing per record
    beyond the transform and the append."""
    count_in = 0
    write = writer.write
    reader = RangeReader(
        config.bootstrap_url, planned.tp, start, planned.end, max_records=config.max_poll_records
    )
    try:
        if fault is None:
            for batch in reader:
                for record in batch:
                    for out in transform(record):
                        write(out)
                count_in += len(batch)
            return count_in
        attempt = _attempt_number()
        for batch in reader:
            for record in batch:
                for out in transform(record):
                    write(out)
                count_in += 1
                fault(TaskProgress(planned.tp, attempt, count_in, writer.flush))
        return count_in
    finally:
        reader.close()


def _partition_task(
    config: PipelineConfig, transform: RecordTransform, fault: FaultHook | None
) -> Callable[[Iterable[OffsetRange]], Iterator[PartitionOutcome]]:
    def run(ranges: Iterable[OffsetRange]) -> Iterator[PartitionOutcome]:
        for planned in ranges:
            yield process_partition(config, planned, transform, fault)

    return run


def run_batch(
    spark: SparkSession,
    config: PipelineConfig,
    transform: RecordTransform,
    fault: FaultHook | None = None,
) -> list[PartitionOutcome] | None:
    """Plan and run one batch of the record-transform job; None if there was nothing."""
    ranges = [
        r
        for r in plan_ranges(
            config.bootstrap_url, config.source_topic, group_id=config.group_id,
            max_records_per_partition=config.max_batch_records,
        )
        if not r.empty
    ]
    if not ranges:
        return None
    rdd = spark.sparkContext.parallelize(ranges, len(ranges))
    outcomes: list[PartitionOutcome] = rdd.mapPartitions(
        _partition_task(config, transform, fault)
    ).collect()
    return outcomes


def run_dataframe_batch(
    spark: SparkSession, config: PipelineConfig, transform: DataFrameTransform
) -> list[PartitionOutcome] | None:
    """One batch of the DataFrame-transform job: one atomic write with the offsets.

    The outcome has a row per source range (offsets only: the records are counted by the
    write, not per partition) and a last row, topic ``"*"``, with the batch's totals."""
    tid = f"{config.application_id}-{config.source_topic}-df"
    # Settle any write a dead driver left open before planning from the committed offsets.
    fence = TransactionSession(config.bootstrap_url, tid)
    try:
        fence.init()
    finally:
        fence.close()
    ranges = [
        r
        for r in plan_ranges(
            config.bootstrap_url, config.source_topic, group_id=config.group_id,
            max_records_per_partition=config.max_batch_records, require_stable=True,
        )
        if not r.empty
    ]
    if not ranges:
        return None
    out = transform(read_ranges(spark, config.bootstrap_url, ranges))
    result = write_atomic(
        out, config.bootstrap_url, tid, source_offsets={r.tp: r.end for r in ranges},
        group_id=config.group_id, transaction_timeout_ms=config.transaction_timeout_ms,
    )
    records_in = sum(r.end - r.start for r in ranges)
    return [
        PartitionOutcome(r.topic, r.partition, r.start, r.end, 0, 0) for r in ranges
    ] + [PartitionOutcome("*", -1, 0, 0, records_in, result.total)]


def run_pipeline(
    spark: SparkSession,
    config: PipelineConfig,
    *,
    transform: RecordTransform | None = None,
    dataframe_transform: DataFrameTransform | None = None,
    fault: FaultHook | None = None,
    on_batch: Callable[[int, list[PartitionOutcome]], None] | None = None,
) -> PipelineStats:
    """Run batches until the source is drained (or forever with ``config.follow``)."""
    if (transform is None) == (dataframe_transform is None):
        raise ValueError("give exactly one of transform= and dataframe_transform=")
    if dataframe_transform is not None and not config.transactional:
        raise ValueError("the DataFrame job always writes atomically")
    stats = PipelineStats()
    began = time.monotonic()
    while True:
        if transform is not None:
            outcomes = run_batch(spark, config, transform, fault)
        else:
            assert dataframe_transform is not None
            outcomes = run_dataframe_batch(spark, config, dataframe_transform)
        if outcomes is None:
            if not config.follow:
                break
            time.sleep(config.poll_interval_s)
            continue
        stats.batches += 1
        stats.records_in += sum(o.records_in for o in outcomes)
        stats.records_out += sum(o.records_out for o in outcomes)
        stats.outcomes.extend(outcomes)
        if on_batch is not None:
            on_batch(stats.batches, outcomes)
    stats.seconds = time.monotonic() - began
    return stats


CREDENTIAL_VARIABLES = ("EOS_TOKEN", "EOS_CA_FILE")


def build_session(
    master: str | None = "local[2]", app_name: str = "eos-pipeline", **conf: str
) -> SparkSession:
    """A SparkSession for the job; ``master=None`` leaves it to ``spark-submit``."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        # A Python data source (``format("eos")``) plans and commits in Python workers
        # started per call; on a busy machine one may take longer than the 15 s default to
        # connect back to the JVM, which fails the query.
        "spark.python.authenticate.socketTimeout": "120s",
    }
    if master and master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # Local executors run on this machine: give them this interpreter (and so the SDK
        # installed beside it), not whatever ``python3`` is first on the PATH. PySpark
        # reads the variable when the context starts, so the session config is not enough.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if master and master.startswith("local") and os.environ["PYSPARK_PYTHON"] == sys.executable:
        # ... and a daemon that imported the SDK once for all its workers (worker_daemon)
        defaults["spark.python.daemon.module"] = "spark_jobs.worker_daemon"
    for variable in CREDENTIAL_VARIABLES:
        # The SDK in the executors reads its credentials from the same variables; Spark
        # redacts settings named like *token* in its UI and logs.
        if os.environ.get(variable):
            defaults[f"spark.executorEnv.{variable}"] = os.environ[variable]
    for name, value in {**defaults, **conf}.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


def with_overrides(config: PipelineConfig, **changes: Any) -> PipelineConfig:
    """A copy of ``config`` with some fields changed."""
    return replace(config, **changes)


if __name__ == "__main__":  # spark-submit spark_jobs/eos_pipeline.py run ...
    from spark_jobs.cli import main

    main()
