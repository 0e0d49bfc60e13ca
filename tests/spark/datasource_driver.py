"""A Spark driver that a test runs as a child process, so that it can SIGKILL it.

Killing a driver must take its JVM and Python workers too, as when a driver host dies;
that needs a process of its own (started in a session of its own), not the test's
SparkSession. The driver runs one ``format("eos")`` query to the end of its input
(``trigger(availableNow=True)``) from a checkpoint, and exits 0; started again on the
same checkpoint it goes on where the dead one stopped.

    python -m tests.spark.datasource_driver copy --bootstrap URL --source IN --sink OUT \\
        --prefix QUERY --checkpoint DIR [--max-records N]
    python -m tests.spark.datasource_driver windows --output-mode update ...

``copy`` writes ``out:<value>`` with the same key. ``windows`` counts records per 10 s
event-time window (event time = the integer before ``:`` in the value, in seconds) with a
watermark, and writes ``<window start>,<count>`` keyed by the window start: in append mode
through ``format("eos")``; in update mode through ``foreachBatch`` and the batch writer
with ``transactionalId`` per batch and ``writeOnce``, because PySpark's Python data
sources take append mode only ("eos does not support Update mode").

Where the driver dies comes from the environment: ``EOS_SPARK_TEST_KILL_AT`` (the sink's
seam in ``spark_jobs.datasource.stream_write``; in update mode ``after_eos_commit`` is
this program's own: after the batch write of batch 0, before Spark's commit log) or
``EOS_TEST_BLOCK_MARKER``: the task of source partition 1 writes that file and blocks for
good, while the other task writes, so the test kills the driver with the batch's tasks
under way.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

from spark_jobs.datasource import register
from spark_jobs.datasource.stream_write import KILL_AT_ENV, KILL_MARKER_ENV
from spark_jobs.eos_pipeline import build_session
from tests.spark.conftest import SPARK_CONF

BLOCK_MARKER_ENV = "EOS_TEST_BLOCK_MARKER"
WINDOW = "10 seconds"
WATERMARK = "10 minutes"


def _block_partition_1(partition: int) -> int:
    """Runs in a task: the row of partition 1 notes the marker and never returns."""
    marker = os.environ.get(BLOCK_MARKER_ENV)
    if marker and partition == 1:
        Path(marker).write_text(f"blocked {os.getpid()}\n")
        while True:
            time.sleep(1)
    return partition


def source(spark: Any, bootstrap: str, topic: str, max_records: int) -> Any:
    return (
        spark.readStream.format("eos").option("bootstrap", bootstrap)
        .option("subscribe", topic).option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(max_records)).load()
    )  # fmt: skip


def copied(df: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    block = F.udf(_block_partition_1, IntegerType())
    return df.where(block(F.col("partition")) >= 0).select(
        F.col("key").cast("string").alias("key"),
        F.concat(F.lit("out:"), F.col("value").cast("string")).alias("value"),
    )


def event_time(df: Any) -> Any:
    """The records with their event time (the integer before ``:`` in the value)."""
    from pyspark.sql import functions as F

    seconds = F.split(F.col("value").cast("string"), ":").getItem(0).cast("long")
    return df.select(F.timestamp_seconds(seconds).alias("event_time"))


def window_counts(df: Any) -> Any:
    """Counts per event-time window: the same expression for the stream and the batch."""
    from pyspark.sql import functions as F

    return df.groupBy(F.window("event_time", WINDOW)).count().select(
        F.col("window.start").cast("long").cast("string").alias("key"),
        F.concat_ws(",", F.col("window.start").cast("long"), F.col("count")).alias("value"),
    )


def write_once_per_batch(bootstrap: str, sink: str, prefix: str) -> Any:
    """A ``foreachBatch`` function: each micro-batch one batch write, recognised when
    Spark replays it (``transactionalId`` per batch id, ``writeOnce``)."""

    def write(df: Any, batch_id: int) -> None:
        (df.write.format("eos").mode("append").option("bootstrap", bootstrap)
           .option("topic", sink).option("transactionalId", f"{prefix}-{batch_id}")
           .option("writeOnce", "true").save())  # fmt: skip
        if os.environ.get(KILL_AT_ENV) == "after_eos_commit":
            Path(os.environ[KILL_MARKER_ENV]).write_text(f"after_eos_commit {batch_id}\n")
            os.killpg(os.getpgid(0), signal.SIGKILL)  # this driver, its JVM and workers

    return write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("query", choices=("copy", "windows"))
    for name in ("--bootstrap", "--source", "--sink", "--prefix", "--checkpoint"):
        parser.add_argument(name, required=True)
    parser.add_argument("--max-records", type=int, default=20)
    parser.add_argument("--output-mode", default="append", choices=("append", "update"))
    args = parser.parse_args(argv)
    spark = build_session("local[2,4]", "eos-datasource-driver", **SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = source(spark, args.bootstrap, args.source, args.max_records)
    if args.query == "copy":
        out, mode = copied(df), "append"
    else:
        out = window_counts(event_time(df).withWatermark("event_time", WATERMARK))
        mode = args.output_mode
    if mode == "update":
        writer = out.writeStream.outputMode(mode).foreachBatch(
            write_once_per_batch(args.bootstrap, args.sink, args.prefix)
        )
    else:
        writer = (
            out.writeStream.format("eos").outputMode(mode).option("bootstrap", args.bootstrap)
            .option("topic", args.sink).option("transactionalIdPrefix", args.prefix)
        )  # fmt: skip
    query = (
        writer.option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    failed = query.exception()
    spark.stop()
    if failed is not None:
        print(f"query failed: {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
