"""The exactly-once pipeline under faults: a task that raises mid-write, a Python worker
killed with SIGKILL, speculation on, a zombie attempt that resumes after its successor's
init. In each case the output, read read_committed, holds every input exactly once and the
committed offsets equal the end of the input; the at-least-once job under the same fault
duplicates, so the check can fail."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sdk import AdminClient, FatalError, Producer, TransactionAbortedError
from spark_jobs.check import CheckReport, check_topics, offsets_at_end, read_all
from spark_jobs.eos_pipeline import (
    FaultHook,
    PipelineConfig,
    PipelineStats,
    TaskProgress,
    process_partition,
    run_pipeline,
)
from spark_jobs.examples import events
from spark_jobs.reader import plan_ranges
from tests.spark.conftest import spark_session
from tests.spark.helpers import (
    FailFirstAttempt,
    KillWorkerFirstAttempt,
    SlowFirstAttempt,
    produce_numbers,
    tag_to,
    uid,
    untag,
)
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time

INPUT = 240


@pytest.fixture
def spark() -> Any:
    """Speculation on, as eagerly as Spark allows, for every test of the module."""
    return spark_session(
        **{
            "spark.speculation": "true",
            "spark.speculation.interval": "100ms",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.minTaskRuntime": "200ms",
        }
    )


def _job(
    spark: Any,
    cluster: Cluster,
    *,
    transactional: bool = True,
    fault: FaultHook | None = None,
    partitions: int = 2,
    batch: int = 100,
    write_batch: int = 10_000,
) -> tuple[list[str], str, PipelineConfig, PipelineStats]:
    source = cluster.create_topic(partitions=partitions, prefix="in")
    sink = cluster.create_topic(partitions=partitions, prefix="out")
    values = produce_numbers(cluster.url, source, INPUT)
    config = PipelineConfig(
        cluster.url, uid("app"), source, transactional=transactional, max_batch_records=batch,
        write_batch_records=write_batch,
    )
    stats = run_pipeline(spark, config, transform=tag_to(sink), fault=fault)
    return values, sink, config, stats


def _exactly_once(values: list[str], sink: str, config: PipelineConfig) -> CheckReport:
    report = check_topics(config.bootstrap_url, [sink], values, untag)
    offsets = offsets_at_end(config.bootstrap_url, config.source_topic, config.group_id)
    assert all(c == end for c, end in offsets.values()), offsets
    return report


def test_every_input_once_in_batches(spark: Any, cluster: Cluster) -> None:
    values, sink, config, stats = _job(spark, cluster, batch=50)
    assert stats.batches >= 2 and stats.records_in == INPUT
    report = _exactly_once(values, sink, config)
    assert report.ok, report


def test_a_task_raising_mid_write_is_retried_without_effect(
    spark: Any, cluster: Cluster
) -> None:
    values, sink, config, _ = _job(spark, cluster, fault=FailFirstAttempt(after=30))
    report = _exactly_once(values, sink, config)
    assert report.ok, report
    written = read_all(cluster.url, sink, isolation_level="read_uncommitted")
    assert len(written) > INPUT, "the failed attempt's output reached the node (aborted)"


def test_a_task_failing_after_many_write_batches_is_retried_without_effect(
    spark: Any, cluster: Cluster
) -> None:
    """Batches of 7 records: the failed attempt has several acknowledged batches of its
    transaction on the node (both partitions fail once), and the retry, numbering its
    batches from 0 again under a new epoch, is neither refused nor duplicated."""
    values, sink, config, _ = _job(
        spark, cluster, fault=FailFirstAttempt(after=45, partitions=(0, 1)), write_batch=7
    )
    report = _exactly_once(values, sink, config)
    assert report.ok, report
    written = read_all(cluster.url, sink, isolation_level="read_uncommitted")
    assert len(written) >= INPUT + 2 * 45, "both failed attempts' batches reached the node"


def test_the_at_least_once_job_duplicates_under_the_same_fault(
    spark: Any, cluster: Cluster
) -> None:
    values, sink, config, _ = _job(
        spark, cluster, transactional=False, fault=FailFirstAttempt(after=30)
    )
    report = _exactly_once(values, sink, config)
    assert not report.ok
    assert len(report.duplicates) >= 30 and not report.lost, report


def test_a_python_worker_killed_by_sigkill_is_retried_without_effect(
    spark: Any, cluster: Cluster
) -> None:
    values, sink, config, _ = _job(
        spark, cluster, fault=KillWorkerFirstAttempt(after=40, partitions=(0, 1))
    )
    report = _exactly_once(values, sink, config)
    assert report.ok, report


def test_with_speculation_on_a_slow_attempt_changes_nothing(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """A slow first attempt: on a cluster speculation starts a copy on another executor,
    whose init fences the slow one. (Local mode has one host, and Spark never runs two
    attempts of a task on one host, so here the slow attempt usually just finishes; the
    zombie test below makes the two attempts meet.)"""
    values, sink, config, _ = _job(spark, cluster, fault=SlowFirstAttempt(tmp_path, 0.05))
    report = _exactly_once(values, sink, config)
    assert report.ok, report
    attempts = sorted(p.name for p in tmp_path.iterdir())
    print("attempts (partition-attempt-pid):", attempts)


def test_a_zombie_attempt_resuming_after_its_successor_has_no_effect(cluster: Cluster) -> None:
    """Two attempts of one partition's task: the first stops half way (a paused
    executor), the second inits, fences it, and does the whole work; then the first
    resumes and fails without effect."""
    source = cluster.create_topic(partitions=1, prefix="in")
    sink = cluster.create_topic(partitions=1, prefix="out")
    values = produce_numbers(cluster.url, source, 120)
    config = PipelineConfig(cluster.url, uid("app"), source, max_batch_records=None)
    (planned,) = plan_ranges(cluster.url, source, group_id=config.group_id)
    paused, resume = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def pause_half_way(progress: TaskProgress) -> None:
        if threading.current_thread().name == "zombie" and progress.records == 60:
            progress.flush()
            paused.set()
            resume.wait(30)

    def zombie() -> None:
        try:
            process_partition(config, planned, tag_to(sink), pause_half_way)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=zombie, name="zombie")
    thread.start()
    assert paused.wait(30)
    outcome = process_partition(config, planned, tag_to(sink))
    assert outcome.records_in == 120
    resume.set()
    thread.join(30)
    assert failure and isinstance(failure[0], FatalError | TransactionAbortedError), failure
    report = _exactly_once(values, sink, config)
    assert report.ok, report


def test_the_sample_pipeline_in_both_forms(spark: Any, cluster: Cluster) -> None:
    source = cluster.create_topic(partitions=2, prefix="events")
    outputs = {}
    with AdminClient(cluster.url) as admin:
        for form in ("records", "dataframe"):
            outputs[form] = (uid("enriched"), uid("dead"))
            for topic in outputs[form]:
                admin.create_topic(topic, 2)
    events.make_events(cluster.url, source, 150)
    expected = [events.source_of(r) for r in read_all(cluster.url, source)]
    seen = {}
    for form, (enriched, dead) in outputs.items():
        config = PipelineConfig(cluster.url, uid(f"sample-{form}"), source, max_batch_records=60)
        if form == "records":
            run_pipeline(spark, config, transform=events.record_transform(enriched, dead))
        else:
            made = events.dataframe_transform(enriched, dead)
            run_pipeline(spark, config, dataframe_transform=made)
        report = check_topics(cluster.url, [enriched, dead], expected, events.output_source)
        assert report.ok, (form, report)
        dead_letters = read_all(cluster.url, dead)
        assert len(dead_letters) == sum(1 for i in range(150) if i % 17 in (5, 11, 13))
        seen[form] = sorted(
            (i, str(r.key), str(r.value))
            for i, topic in enumerate((enriched, dead))
            for r in read_all(cluster.url, topic)
        )
    assert seen["records"] == seen["dataframe"]


def test_the_checker_catches_a_planted_duplicate(spark: Any, cluster: Cluster) -> None:
    values, sink, _, _ = _job(spark, cluster)
    assert check_topics(cluster.url, [sink], values, untag).ok
    (victim, *_) = read_all(cluster.url, sink)
    with Producer(cluster.url) as producer:
        producer.send(sink, victim.value, key=victim.key, partition=victim.partition)
        producer.flush()
    report = check_topics(cluster.url, [sink], values, untag)
    assert not report.ok and list(report.duplicates) == [untag(victim)], report
    lost = check_topics(cluster.url, [sink], [*values, "never-sent"], untag)
    assert lost.lost == ["never-sent"]
