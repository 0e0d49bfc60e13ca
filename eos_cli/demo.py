"""``eos demo``: the product in one minute, as a Spark user meets it.

Brings a local cluster up (or uses a running one), writes sample JSON events, and runs the
Structured Streaming query a Spark user would copy — ``spark.readStream.format("eos")``, a
transformation, ``writeStream.format("eos")`` with a checkpoint — in local mode, while the
first attempt of one sink task is made to fail half way through its write (its first
batches acknowledged, inside the micro-batch's open transaction) and is retried by Spark.
Then it checks the outcome the way a skeptical user would: every input event exactly once
in the outputs, nothing of the failed attempt twice, and the sink's record of the last
micro-batch it committed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spark_jobs.check import CheckReport

console = Console()
SOURCE, ENRICHED, DEAD_LETTER = "demo-events", "demo-enriched", "demo-dead-letter"


#: The query the demo runs, as a user writes it (printed by the demo, kept in docs/spark.md).
QUERY = """\
events = (spark.readStream.format("eos").option("bootstrap", url)
          .option("subscribe", source).option("startingOffsets", "earliest").load())
enriched = dataframe_transform(enriched_topic, dead_letter_topic)(
    events.withColumn("key", col("key").cast("string"))
          .withColumn("value", col("value").cast("string")))
query = (enriched.writeStream.format("eos").option("bootstrap", url)
         .option("transactionalIdPrefix", app).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())"""


@dataclass(frozen=True)
class StreamStats:
    batches: int
    last_batch: int  # the last micro-batch id with input (-1: none)
    records_in: int
    seconds: float


@contextmanager
def cluster_for_demo(bootstrap: str | None, port_base: int) -> Iterator[str]:
    """A running cluster's URL: the one given, or a fresh local one stopped afterwards."""
    if bootstrap:
        yield bootstrap
        return
    from eos_cli.up import Cluster, ClusterPlan

    data_dir = Path(tempfile.mkdtemp(prefix="eos-demo-"))
    cluster = Cluster(ClusterPlan(data_dir=data_dir, port_base=port_base))
    try:
        cluster.start()
        yield cluster.bootstrap_url
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def demo(
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", "-b", help="Use this running cluster.")
    ] = None,
    events: Annotated[int, typer.Option(min=10, help="How many sample events.")] = 5000,
    partitions: Annotated[int, typer.Option(min=1, max=16)] = 3,
    port_base: Annotated[int, typer.Option(help="Ports of the local cluster.")] = 18080,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2,4]",
) -> None:
    """Run an exactly-once Structured Streaming query over sample events, with a sink task
    that fails once, and check the result: input count, output count, duplicates 0, lost 0."""
    run_id = time.strftime("%H%M%S")
    source, app = f"{SOURCE}-{run_id}", f"demo-{run_id}"
    progress = Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        TextColumn("{task.completed:>6}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress, cluster_for_demo(bootstrap, port_base) as url:
        step = progress.add_task("cluster ready", total=1, completed=1)
        step = progress.add_task(f"writing {events} events to {source}", total=events)
        _write_events(url, source, partitions, events)
        progress.update(step, completed=events)
        step = progress.add_task("Structured Streaming (1 task fails once)", total=events)

        def on_batch(records: int) -> None:
            progress.advance(step, records)

        scratch = Path(tempfile.mkdtemp(prefix="eos-demo-"))
        witness = scratch / "fault-fired"
        try:
            stats = _run_stream(url, app, source, master, on_batch, events, scratch, witness)
            fired = witness.exists()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        progress.update(step, completed=events)
        step = progress.add_task("checking with read_committed", total=1)
        report, recorded, output_count = _check(url, app, source)
        progress.update(step, completed=1)

    console.print()
    console.print(f"input events        {report.expected}")
    console.print(
        f"output records      {output_count}  ({ENRICHED}-{run_id} and {DEAD_LETTER}-{run_id})"
    )
    console.print(f"duplicates          {len(report.duplicates)}")
    console.print(f"lost                {len(report.lost)}")
    console.print(f"unexpected          {len(report.unexpected)}")
    batches_ok = recorded == stats.last_batch + 1
    console.print(
        f"micro-batches       {stats.batches}, the last recorded in its transaction"
        if batches_ok
        else f"micro-batches       {stats.batches}, but the sink recorded {recorded}: WRONG"
    )
    console.print(f"planted task fault  {'fired, task retried' if fired else 'did not fire'}")
    console.print(
        f"query               {stats.records_in / max(stats.seconds, 1e-9):,.0f} records/s"
    )
    console.print()
    console.print("[bold]the query[/bold] (docs/spark.md):")
    console.print(QUERY, markup=False, highlight=False)
    if report.ok and batches_ok and fired:
        console.print(
            "[bold green]exactly once[/bold green]: every event delivered once, "
            "the failed attempt's records never visible"
        )
        return
    console.print(f"[bold red]NOT exactly once[/bold red]: {report}")
    raise typer.Exit(1)


def _names(source: str) -> tuple[str, str]:
    suffix = source.removeprefix(f"{SOURCE}-")
    return f"{ENRICHED}-{suffix}", f"{DEAD_LETTER}-{suffix}"


def _write_events(url: str, source: str, partitions: int, count: int) -> None:
    from sdk import AdminClient
    from spark_jobs.examples.events import make_events

    enriched, dead_letter = _names(source)
    with AdminClient(url) as admin:
        admin.create_topic(source, partitions)
        admin.create_topic(enriched, partitions)
        admin.create_topic(dead_letter, 1)
    make_events(url, source, count)


def _run_stream(
    url: str,
    app: str,
    source: str,
    master: str,
    on_batch: Callable[[int], None],
    events: int,
    scratch: Path,
    witness: Path,
) -> StreamStats:
    """The query of ``QUERY``, its sink task 0 failing once after a quarter of its share."""
    from pyspark.sql.functions import col

    from spark_jobs.datasource import register
    from spark_jobs.datasource.planted_fault import FAIL_TASK_ONCE_ENV
    from spark_jobs.eos_pipeline import build_session
    from spark_jobs.examples.events import dataframe_transform

    enriched_topic, dead_letter_topic = _names(source)
    os.environ[FAIL_TASK_ONCE_ENV] = f"{witness}:{max(events // 8, 1)}"
    spark = build_session(
        master,
        "eos-demo",
        **{
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )
    # The planted fault makes Spark log the failed task's traceback; the demo reports the
    # retry itself, so keep the console for the progress and the check.
    spark.sparkContext.setLogLevel("FATAL")
    register(spark)
    started = time.monotonic()
    try:
        events_df = (
            spark.readStream.format("eos").option("bootstrap", url)
            .option("subscribe", source).option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", str(max(events // 2, 1))).load()
        )  # fmt: skip
        enriched = dataframe_transform(enriched_topic, dead_letter_topic)(
            events_df.withColumn("key", col("key").cast("string")).withColumn(
                "value", col("value").cast("string")
            )
        )
        query = (
            enriched.writeStream.format("eos").option("bootstrap", url)
            .option("transactionalIdPrefix", app)
            .option("checkpointLocation", str(scratch / "checkpoint"))
            # small batches streamed as they are cut, so the fault strikes after some of
            # the task's records are on the node
            .option("batchRecords", str(max(events // 20, 1))).option("sortWithinTask", "false")
            .trigger(availableNow=True).start()
        )  # fmt: skip
        return _follow(query, on_batch, started)
    finally:
        os.environ.pop(FAIL_TASK_ONCE_ENV, None)
        spark.stop()


def _follow(query: Any, on_batch: Callable[[int], None], started: float) -> StreamStats:
    """Wait for the query, reporting each micro-batch's input; its stats at the end."""
    seen: set[int] = set()
    records = 0

    def report() -> None:
        nonlocal records
        for progress in query.recentProgress:
            batch = int(progress["batchId"])
            rows = int(progress["numInputRows"])
            if batch not in seen and rows:
                seen.add(batch)
                records += rows
                on_batch(rows)

    while not query.awaitTermination(0.5):
        report()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    report()
    return StreamStats(len(seen), max(seen, default=-1), records, time.monotonic() - started)


def _check(url: str, app: str, source: str) -> tuple[CheckReport, int | None, int]:
    """The outputs against the input, and the next micro-batch the sink recorded."""
    from spark_jobs.check import check_topics, read_all
    from spark_jobs.datasource.options import sink_options
    from spark_jobs.datasource.stream_write import next_batch
    from spark_jobs.examples.events import output_source, source_of

    enriched, dead_letter = _names(source)
    expected = [source_of(r) for r in read_all(url, source)]
    report = check_topics(url, [enriched, dead_letter], expected, output_source)
    options = sink_options({"bootstrap": url, "transactionalIdPrefix": app}, streaming=True)
    return report, next_batch(options), report.delivered


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
