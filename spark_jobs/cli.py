"""``eos spark``: run the exactly-once pipeline, write the sample input, check a run.

``eos spark run`` is also what ``spark-submit spark_jobs/eos_pipeline.py run ...`` runs on
a cluster (the script's ``__main__`` calls this module), so the flags are the same in
local mode and under ``spark-submit``; ``--master`` is left out there, since spark-submit
sets it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

spark_app = typer.Typer(
    help="PySpark jobs: exactly-once consume-transform-produce.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap", "-b", envvar="EOS_BOOTSTRAP",
        help="Coordinator URLs, comma-separated: any live one will do.",
    ),
]


@spark_app.command("run")
def run(
    bootstrap: Bootstrap,
    app_id: Annotated[str, typer.Option("--app", help="Application id (also the group id).")],
    source: Annotated[str, typer.Option(help="Source topic.")],
    transform: Annotated[
        str, typer.Option(help="module:factory; factory(**options) returns the transform.")
    ],
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="key=value for the factory.")
    ] = None,
    dataframe: Annotated[
        bool, typer.Option(help="The transform takes and returns a DataFrame.")
    ] = False,
    follow: Annotated[bool, typer.Option(help="Keep polling once drained.")] = False,
    transactions: Annotated[
        bool, typer.Option(help="--no-transactions: at-least-once (a baseline).")
    ] = True,
    master: Annotated[
        str | None, typer.Option(help="Spark master; omit under spark-submit.")
    ] = None,
    max_batch_records: Annotated[
        int, typer.Option(help="Most records per source partition in one batch.")
    ] = 100_000,
    transaction_timeout_ms: Annotated[int, typer.Option()] = 120_000,
    write_batch_records: Annotated[
        int, typer.Option(min=1, help="Most records per produce request of a task.")
    ] = 10_000,
    conf: Annotated[
        list[str] | None, typer.Option("--conf", help="key=value Spark settings.")
    ] = None,
) -> None:
    """Run the pipeline until the source is drained (or forever with --follow)."""
    from spark_jobs.eos_pipeline import (
        PartitionOutcome,
        PipelineConfig,
        build_session,
        run_pipeline,
    )
    from spark_jobs.transforms import build_transform, parse_options

    config = PipelineConfig(
        bootstrap_url=bootstrap,
        application_id=app_id,
        source_topic=source,
        transactional=transactions,
        max_batch_records=max_batch_records,
        follow=follow,
        transaction_timeout_ms=transaction_timeout_ms,
        write_batch_records=write_batch_records,
    )
    made = build_transform(transform, parse_options(option or []))
    if master is None and "spark.master" not in parse_options(conf or []):
        master = _master_from_environment()
    spark = build_session(master, f"eos-{app_id}", **parse_options(conf or []))

    def report(batch: int, outcomes: list[PartitionOutcome]) -> None:
        typer.echo(f"batch {batch}: {len(outcomes)} source partition(s) committed", err=True)

    try:
        if dataframe:
            stats = run_pipeline(spark, config, dataframe_transform=made, on_batch=report)
        else:
            stats = run_pipeline(spark, config, transform=made, on_batch=report)
    finally:
        spark.stop()
    typer.echo(
        f"{stats.batches} batches, {stats.records_in} records in, {stats.records_out} out, "
        f"{stats.seconds:.1f}s"
    )


def _master_from_environment() -> str | None:
    """Under spark-submit (which hands the Python process its JVM gateway) the master is
    set already; run alone, the job uses ``local[2]``."""
    return None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[2]"


@spark_app.command("sample-events")
def sample_events(
    bootstrap: Bootstrap,
    topic: Annotated[str, typer.Option(help="Topic to write (created if missing).")],
    count: Annotated[int, typer.Option(help="How many events.")] = 1000,
    partitions: Annotated[int, typer.Option(help="Partitions if it is created.")] = 2,
    start: Annotated[int, typer.Option(help="Number of the first event.")] = 0,
) -> None:
    """Write the sample pipeline's input (JSON events, a few malformed)."""
    from sdk import AdminClient
    from spark_jobs.examples.events import make_events

    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, partitions, exist_ok=True)
    make_events(bootstrap, topic, count, start)
    typer.echo(f"{count} events written to {topic}")


@spark_app.command("check")
def check(
    bootstrap: Bootstrap,
    app_id: Annotated[str, typer.Option("--app", help="Application id (the group).")],
    source: Annotated[str, typer.Option(help="Source topic.")],
    output: Annotated[list[str], typer.Option(help="Output topics (repeat the flag).")],
) -> None:
    """Check a run of the sample pipeline: every input once in the outputs, offsets at
    the end. Exits 1 if not."""
    from spark_jobs.check import check_topics, offsets_at_end, read_all
    from spark_jobs.examples.events import output_source, source_of

    expected = [source_of(r) for r in read_all(bootstrap, source)]
    report = check_topics(bootstrap, output, expected, output_source)
    offsets = offsets_at_end(bootstrap, source, app_id)
    at_end = all(committed == end for committed, end in offsets.values())
    typer.echo(str(report))
    typer.echo(f"committed offsets {'at' if at_end else 'NOT at'} the end: {offsets}")
    if not (report.ok and at_end):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``eos spark ...`` to the ``eos`` application."""
    app.add_typer(spark_app, name="spark")


def main() -> None:
    """``python spark_jobs/eos_pipeline.py run ...`` (and spark-submit) land here."""
    spark_app(prog_name="eos spark")
