"""``eos demo``: the product in one minute.

Brings a local cluster up (or uses a running one), writes sample JSON events, runs the
Spark exactly-once pipeline over them in local mode while one task is made to fail half way
through its transaction and be retried, and then checks the outcome the way a skeptical
user would: every input event exactly once in the outputs, nothing from the failed attempt
visible, and the consumer group's committed offsets at the end of the input.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spark_jobs.check import CheckReport
from spark_jobs.eos_pipeline import PartitionOutcome, PipelineStats, TaskProgress

console = Console()
SOURCE, ENRICHED, DEAD_LETTER = "demo-events", "demo-enriched", "demo-dead-letter"


class FailOnce:
    """The planted fault: the first attempt of one task flushes what it sent so far (so it
    really is on the storage node, inside the open transaction) and then fails. Spark
    retries the task; the retry's ``init_transactions`` aborts the failed attempt's
    transaction, so its records are never shown to read_committed readers."""

    def __init__(self, partition: int, after: int, witness: Path) -> None:
        self.partition = partition
        self.after = after
        self.witness = witness  # a file the fault leaves behind, so the driver knows it fired

    def __call__(self, progress: TaskProgress) -> None:
        if (
            progress.attempt == 0
            and progress.tp.partition == self.partition
            and progress.records == self.after
        ):
            progress.flush()
            self.witness.touch()
            raise RuntimeError(
                f"planted fault: task for {progress.tp.topic}-{progress.tp.partition} "
                f"fails after sending {self.after} records"
            )


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
    """Run the exactly-once Spark pipeline over sample events, with a failing task, and
    check the result: input count, output count, duplicates 0, lost 0."""
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
        step = progress.add_task("Spark pipeline (1 task fails once)", total=events)

        def on_batch(_batch: int, outcomes: list[PartitionOutcome]) -> None:
            progress.advance(step, sum(o.records_in for o in outcomes))

        witness = Path(tempfile.mkdtemp(prefix="eos-demo-fault-")) / "fired"
        stats = _run_pipeline(url, app, source, master, on_batch, events, partitions, witness)
        fired = witness.exists()
        shutil.rmtree(witness.parent, ignore_errors=True)
        progress.update(step, completed=events)
        step = progress.add_task("checking with read_committed", total=1)
        report, offsets_ok, output_count = _check(url, app, source)
        progress.update(step, completed=1)

    console.print()
    console.print(f"input events        {report.expected}")
    console.print(
        f"output records      {output_count}  ({ENRICHED}-{run_id} and {DEAD_LETTER}-{run_id})"
    )
    console.print(f"duplicates          {len(report.duplicates)}")
    console.print(f"lost                {len(report.lost)}")
    console.print(f"unexpected          {len(report.unexpected)}")
    console.print(f"offsets committed   {'at the end of the input' if offsets_ok else 'WRONG'}")
    console.print(f"planted task fault  {'fired, task retried' if fired else 'did not fire'}")
    console.print(
        f"pipeline            {stats.batches} batches, "
        f"{stats.records_in / max(stats.seconds, 1e-9):,.0f} records/s"
    )
    if report.ok and offsets_ok and fired:
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


def _run_pipeline(
    url: str,
    app: str,
    source: str,
    master: str,
    on_batch: Callable[[int, list[PartitionOutcome]], None],
    events: int,
    partitions: int,
    witness: Path,
) -> PipelineStats:
    from spark_jobs.eos_pipeline import PipelineConfig, build_session, run_pipeline
    from spark_jobs.examples.events import record_transform

    enriched, dead_letter = _names(source)
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
    config = PipelineConfig(
        bootstrap_url=url,
        application_id=app,
        source_topic=source,
        max_batch_records=max(events // 2, 1),
    )
    try:
        return run_pipeline(
            spark,
            config,
            transform=record_transform(enriched=enriched, dead_letter=dead_letter),
            fault=FailOnce(partition=0, after=max(events // partitions // 4, 1), witness=witness),
            on_batch=on_batch,
        )
    finally:
        spark.stop()


def _check(url: str, app: str, source: str) -> tuple[CheckReport, bool, int]:
    from spark_jobs.check import check_topics, offsets_at_end, read_all
    from spark_jobs.examples.events import output_source, source_of

    enriched, dead_letter = _names(source)
    expected = [source_of(r) for r in read_all(url, source)]
    report = check_topics(url, [enriched, dead_letter], expected, output_source)
    offsets = offsets_at_end(url, source, app)
    offsets_ok = all(committed == end for committed, end in offsets.values())
    return report, offsets_ok, report.delivered


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
