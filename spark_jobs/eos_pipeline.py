"""The exactly-once consume-transform-produce job on Spark (``eos spark run``).

Batch after batch, the driver plans an ``OffsetRange`` per source partition (from the
group's committed offset up to the last stable offset, at most ``max_batch_records``
long) and runs one Spark task per partition with work. The task that owns source
partition ``p``:

1. opens a ``TransactionalProducer`` with transactional id ``{application_id}-{topic}-{p}``
   and calls ``init_transactions``. The id is the same for every attempt of the task, and
   for the task of ``p`` in every batch and after a driver restart, so the init fences any
   earlier attempt still running (a retried task's predecessor, a speculative twin, a task
   of a dead driver) and aborts what it left open: a fenced attempt has no effect;
2. reads the group's committed offset with ``require_stable`` (now settled by the init),
   then the records read_committed from there up to the planned end;
3. sends the transform's output and the new offset (the planned end) in one transaction,
   and commits.

If the committed offset has reached the end already (an earlier attempt committed before
Spark retried it), the task does nothing. The group id is the application id. Batches
repeat until a plan finds nothing to read, or forever with ``follow``.

With a DataFrame transform the batch is instead read into a DataFrame, transformed, and
written by ``spark_jobs.writer.write_atomic`` with the source offsets in the same
transaction (transactional id ``{application_id}-{topic}-df``).

``transactional=False`` runs the same job at-least-once (idempotent producer, offsets
committed after the output): the baseline of the benchmark, and what the tests show
duplicating output under the same faults.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sdk import Consumer, Producer, ProducerState, TopicPartition, TransactionalProducer
from spark_jobs._wire import TransactionSession
from spark_jobs.reader import OffsetRange, iter_range, plan_ranges, read_ranges
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
    max_poll_records: int = 2000
    linger_ms: int = 5
    batch_size: int = 256 * 1024

    @property
    def group_id(self) -> str:
        return self.application_id

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
    if config.transactional:
        return _process_exactly_once(config, planned, transform, fault)
    return _process_at_least_once(config, planned, transform, fault)


def _process_exactly_once(
    config: PipelineConfig,
    planned: OffsetRange,
    transform: RecordTransform,
    fault: FaultHook | None,
) -> PartitionOutcome:
    tp = planned.tp
    producer = TransactionalProducer(
        config.bootstrap_url, config.transactional_id(tp.partition),
        transaction_timeout_ms=config.transaction_timeout_ms,
        linger_ms=config.linger_ms, batch_size=config.batch_size,
    )
    try:
        producer.init_transactions()  # fences every earlier attempt of this partition
        with Consumer(
            config.bootstrap_url, config.group_id, max_poll_records=config.max_poll_records
        ) as consumer:
            consumer.assign([tp])
            found = consumer.committed([tp], require_stable=True)[tp]
            start = planned.start if found is None else found.offset
            if start >= planned.end:
                return PartitionOutcome(tp.topic, tp.partition, start, planned.end, 0, 0)
            with producer.transaction():
                count_in, count_out = _copy(
                    consumer, tp, start, planned.end, transform, producer.send,
                    producer.flush, fault,
                )
                producer.send_offsets_to_transaction({tp: planned.end}, config.group_id)
        return PartitionOutcome(tp.topic, tp.partition, start, planned.end, count_in, count_out)
    finally:
        if producer.state is not ProducerState.FATAL_ERROR:
            producer.close()
        else:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)


def _process_at_least_once(
    config: PipelineConfig,
    planned: OffsetRange,
    transform: RecordTransform,
    fault: FaultHook | None,
) -> PartitionOutcome:
    tp = planned.tp
    with (
        Producer(
            config.bootstrap_url, linger_ms=config.linger_ms, batch_size=config.batch_size
        ) as producer,
        Consumer(
            config.bootstrap_url, config.group_id, max_poll_records=config.max_poll_records
        ) as consumer,
    ):
        consumer.assign([tp])
        found = consumer.committed([tp], require_stable=False)[tp]
        start = planned.start if found is None else found.offset
        if start >= planned.end:
            return PartitionOutcome(tp.topic, tp.partition, start, planned.end, 0, 0)
        count_in, count_out = _copy(
            consumer, tp, start, planned.end, transform, producer.send, producer.flush, fault
        )
        producer.flush()
        consumer.commit({tp: planned.end})
    return PartitionOutcome(tp.topic, tp.partition, start, planned.end, count_in, count_out)


def _copy(
    consumer: Consumer,
    tp: TopicPartition,
    start: int,
    end: int,
    transform: RecordTransform,
    send: Callable[..., Any],
    flush: Callable[[], None],
    fault: FaultHook | None,
) -> tuple[int, int]:
    """Read ``[start, end)``, send what the transform makes; (records in, records out)."""
    attempt = _attempt_number() if fault is not None else 0
    count_in = count_out = 0
    for record in iter_range(consumer, tp, start, end):
        for out in transform(record):
            send(out.topic, out.value, key=out.key, partition=out.partition, headers=out.headers)
            count_out += 1
        count_in += 1
        if fault is not None:
            fault(TaskProgress(tp, attempt, count_in, flush))
    return count_in, count_out


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
    defaults = {"spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "8"}
    if master and master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # Local executors run on this machine: give them this interpreter (and so the SDK
        # installed beside it), not whatever ``python3`` is first on the PATH. PySpark
        # reads the variable when the context starts, so the session config is not enough.
        os.environ["PYSPARK_PYTHON"] = sys.executable
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
