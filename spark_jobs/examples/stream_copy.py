"""A Structured Streaming job to start from: one topic copied to another exactly once
through ``format("eos")``, runnable as it is with ``spark-submit``::

    spark-submit --master spark://spark-master:7077 --conf spark.driver.host=spark-master \\
      /opt/eos/lib/python3.11/site-packages/spark_jobs/examples/stream_copy.py \\
      --source events --sink events-copy --name events-copy-v1 \\
      --checkpoint /data/spark-work/ck/events-copy-v1

``--name`` becomes the sink's ``transactionalIdPrefix``: keep it for every restart of the
query (with the same checkpoint), and give a new query a new one. A new query starts at
the source's earliest offsets (``--starting-offsets latest``: only what comes next).
``--bootstrap`` defaults to ``EOS_BOOTSTRAP`` (set in the compose project's Spark
containers). ``--available-now`` copies what is there and stops; without it the query runs
until stopped.
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("EOS_BOOTSTRAP"))
    parser.add_argument("--source", required=True, help="the topic to read")
    parser.add_argument("--sink", required=True, help="the topic to write (must exist)")
    parser.add_argument("--name", required=True, help="the query's transactionalIdPrefix")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new query starts (a restarted one: its checkpoint)")
    parser.add_argument("--max-records-per-trigger", type=int, default=100_000)
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or EOS_BOOTSTRAP: the coordinators' URLs")

    from pyspark.sql import SparkSession

    from spark_jobs.datasource import register

    spark = SparkSession.builder.appName(f"eos-stream-copy-{args.name}").getOrCreate()
    register(spark)
    events = (
        spark.readStream.format("eos").option("bootstrap", args.bootstrap)
        .option("subscribe", args.source).option("startingOffsets", args.starting_offsets)
        .option("maxRecordsPerTrigger", str(args.max_records_per_trigger)).load()
    )  # fmt: skip
    writer = (
        events.select("key", "value", "headers").writeStream.format("eos")
        .option("bootstrap", args.bootstrap).option("topic", args.sink)
        .option("transactionalIdPrefix", args.name)
        .option("checkpointLocation", args.checkpoint)
    )  # fmt: skip
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
