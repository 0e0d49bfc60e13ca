"""The driver of ``test_standalone_datasource``: one ``format("eos")`` streaming query on
the standalone cluster, run as a child process so that the test can kill an executor
under it and read its event log afterwards.

    python -m tests.spark.datasource_standalone_job --master spark://... --bootstrap URL \\
        --source IN --sink OUT --prefix QUERY --checkpoint DIR --max-records N \\
        --write-batch N [--conf name=value ...]

The query copies ``v`` to ``out:v`` (same key) from ``readStream.format("eos")`` to
``writeStream.format("eos")`` with ``trigger(availableNow=True)``. Two faults are planted,
each on the first attempt of one task, and configured through the executors'
environment (``spark.executorEnv.*``: the test runs in another process than the tasks,
which tell it where they are with files in ``EOS_TEST_MARKS``):

* ``EOS_TEST_SLOW=<partition>:<offset>``: a UDF over the source columns; every attempt
  passing that record leaves ``reached-<partition>-<offset>-<attempt>-<pid>``, and the
  first attempt waits there until a later attempt of its task has passed it (Spark's
  speculative copy), then goes on: both attempts write the same batches in the same slot,
  so the node drops the second copy's as duplicates.
* ``EOS_TEST_STALL=<batch>:<task>:<records>``: the first attempt of sink task ``<task>``
  of micro-batch ``<batch>`` stalls *inside the sink* once ``<records>`` of its records
  are acknowledged by the node, leaves ``stalled-<pid>`` (JSON: records written, the sink
  partitions' offsets) and hangs until its executor is SIGKILLed; a later attempt of
  that task waits for the test's ``killed`` mark before it writes.

Why the stall is in the sink and not in the UDF: rows reach the sink's Python worker in
Arrow batches, so where an upstream stall falls against the sink's writes depends on
batch sizes, not on the test. The sink's own seam after each acknowledged batch,
``planted_fault.after_written``, is where a write is really half done; this program's
subclass of the stream writer hooks it for the one attempt, nothing else changes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from sdk import AdminClient, TopicPartition
from spark_jobs.datasource import planted_fault
from spark_jobs.datasource.options import sink_options
from spark_jobs.datasource.source import PUSHDOWN_CONF, EosDataSource
from spark_jobs.datasource.stream_write import EosStreamWriter, batch_of_task
from spark_jobs.eos_pipeline import build_session

MARKS_ENV = "EOS_TEST_MARKS"
SLOW_ENV = "EOS_TEST_SLOW"
STALL_ENV = "EOS_TEST_STALL"
STALLED = "stalled-"
KILLED = "killed"  # the test's mark: the stalled attempt's executor is SIGKILLed
PATIENCE_S = 90.0


def _attempt() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.attemptNumber())


def slow_first_attempt(partition: int, offset: int) -> int:
    """The UDF: at ``EOS_TEST_SLOW``'s record, the first attempt waits for another one."""
    spec = os.environ.get(SLOW_ENV, "")
    if not spec or (partition, offset) != tuple(int(n) for n in spec.split(":")):
        return partition
    marks = Path(os.environ[MARKS_ENV])
    attempt = _attempt()
    prefix = f"reached-{partition}-{offset}-"
    (marks / f"{prefix}{attempt}-{os.getpid()}").touch()
    deadline = time.monotonic() + PATIENCE_S
    while attempt == 0 and time.monotonic() < deadline:
        attempts = {p.name.removeprefix(prefix).split("-")[0] for p in marks.glob(f"{prefix}*")}
        if attempts - {"0"}:
            break  # at the deadline go on regardless: the test finds no speculative copy
        time.sleep(0.05)
    return partition


def _stall_point() -> tuple[int, int, int] | None:
    spec = os.environ.get(STALL_ENV, "")
    if not spec:
        return None
    batch, task, records = (int(n) for n in spec.split(":"))
    return batch, task, records


def _stall_once_written(bootstrap: str, topic: str, after: int) -> Any:
    """A replacement of ``planted_fault.after_written`` that hangs at ``after`` records."""

    def after_written(records: int) -> None:
        if records < after:
            return
        with AdminClient(bootstrap) as admin:
            count = len(admin.describe_topic(topic).partitions)
            offsets = {p: admin.list_offsets(TopicPartition(topic, p)) for p in range(count)}
        state = {
            "records": records,
            "offsets": {p: [o.high_watermark, o.last_stable_offset] for p, o in offsets.items()},
        }
        marks = Path(os.environ[MARKS_ENV])
        (marks / f"{STALLED}{os.getpid()}").write_text(json.dumps(state))
        time.sleep(PATIENCE_S)  # the hung task: its executor is killed meanwhile
        raise RuntimeError(f"the stalled attempt was not killed in {PATIENCE_S}s")

    return after_written


def _wait_for_the_kill() -> None:
    """A later attempt of the stalled task (a speculative copy may start while the first
    attempt hangs) waits until the test has killed the first one's executor: had the copy
    finished first, Spark would end the first attempt as killed, not lost with its
    executor, and the fault under test would not have happened."""
    killed = Path(os.environ[MARKS_ENV]) / KILLED
    deadline = time.monotonic() + PATIENCE_S
    while not killed.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class StallingStreamWriter(EosStreamWriter):
    """The sink, with ``EOS_TEST_STALL``'s attempt hooked at the acknowledged-batch seam."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        point = _stall_point()
        context = TaskContext.get()
        if point is None or context is None or self.spec.default_topic is None:
            return super().write(iterator)
        if (batch_of_task(), context.partitionId()) != point[:2]:
            return super().write(iterator)
        if context.attemptNumber() > 0:
            _wait_for_the_kill()
            return super().write(iterator)
        original = planted_fault.after_written
        # The Python worker is reused by later tasks: the hook lives for this write only.
        planted_fault.after_written = _stall_once_written(
            self.spec.connection.bootstrap.split(",")[0], self.spec.default_topic, point[2]
        )
        try:
            return super().write(iterator)
        finally:
            planted_fault.after_written = original


class StallingEos(EosDataSource):
    """``format("eos")`` whose stream writer is ``StallingStreamWriter``."""

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return StallingStreamWriter(sink_options(self.options, streaming=True), schema)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--master", "--bootstrap", "--source", "--sink", "--prefix", "--checkpoint"):
        parser.add_argument(name, required=True)
    parser.add_argument("--max-records", type=int, required=True)
    parser.add_argument("--write-batch", type=int, required=True)
    parser.add_argument("--conf", action="append", default=[])
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    spark = build_session(args.master, "eos-datasource-standalone", **conf)
    spark.sparkContext.setLogLevel("WARN")
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(StallingEos)
    slow = F.udf(slow_first_attempt, IntegerType())
    out = (
        spark.readStream.format("eos").option("bootstrap", args.bootstrap)
        .option("subscribe", args.source).option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(args.max_records)).load()
        .where(slow(F.col("partition"), F.col("offset")) >= 0)
        .select(F.col("key").cast("string").alias("key"),
                F.concat(F.lit("out:"), F.col("value").cast("string")).alias("value"))
    )  # fmt: skip
    query = (
        out.writeStream.format("eos").option("bootstrap", args.bootstrap)
        .option("topic", args.sink).option("transactionalIdPrefix", args.prefix)
        .option("sortWithinTask", "false").option("batchRecords", str(args.write_batch))
        .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    failed = query.exception()
    spark.stop()
    if failed is not None:
        print(f"query failed: {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    # Under its importable name, so that cloudpickle ships the UDF and the data source's
    # classes by reference (the executors import this module from the repository).
    from tests.spark import datasource_standalone_job

    raise SystemExit(datasource_standalone_job.main())
