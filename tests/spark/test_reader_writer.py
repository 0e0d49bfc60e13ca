"""Reading a topic into a DataFrame (read_committed, planned ranges) and the atomic
DataFrame write: all of it or none of it, whatever Spark retries."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sdk import Consumer, ProducerFencedError, TopicPartition, TransactionalProducer
from spark_jobs._wire import SequencedPartitionWriter, TransactionSession
from spark_jobs.check import compare, read_all
from spark_jobs.datasource.options import Connection
from spark_jobs.datasource.task_write import SlotSender, TaskWriteSpec, cut_batches
from spark_jobs.reader import plan_ranges, read_ranges, read_topic
from spark_jobs.writer import WriteOptions, default_partition, write_atomic
from tests.spark.helpers import fail_write_always, fail_write_first_attempt, produce_numbers, uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time


def _rows(spark: Any, count: int, start: int = 0) -> Any:
    return spark.createDataFrame(
        [(f"k{i}", f"v{i}") for i in range(start, start + count)], "key string, value string"
    )


def test_read_topic_is_read_committed_and_planned(spark: Any, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="src")
    produce_numbers(cluster.url, topic, 30)
    with TransactionalProducer(cluster.url, uid("aborter")) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, f"aborted-{i}", key=f"a{i}")
        producer.flush()
        producer.abort_transaction()
    produce_numbers(cluster.url, topic, 5, start=100)

    df = read_topic(spark, cluster.url, topic)
    assert df.rdd.getNumPartitions() == 2
    values = sorted(row["value"] for row in df.collect())
    assert values == sorted([str(i) for i in range(30)] + [str(i) for i in range(100, 105)])
    assert set(df.columns) >= {"topic", "partition", "offset", "key", "value", "timestamp_ms"}

    capped = plan_ranges(cluster.url, topic, max_records_per_partition=3)
    assert all(r.end - r.start == 3 for r in capped)
    assert read_ranges(spark, cluster.url, capped).count() == 6


def test_write_atomic_writes_every_row_once_by_key(spark: Any, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=3, prefix="sink")
    result = write_atomic(
        _rows(spark, 300), cluster.url, uid("w"), topic=topic,
        options=WriteOptions(batch_records=25),
    )
    assert result.total == 300
    records = read_all(cluster.url, topic)
    assert compare([f"v{i}" for i in range(300)], [str(r.value) for r in records]).ok
    assert all(r.partition == default_partition(str(r.key), None, 3) for r in records)


def test_a_retried_write_task_leaves_no_duplicate(spark: Any, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="sink")
    result = write_atomic(
        _rows(spark, 400), cluster.url, uid("w"), topic=topic,
        options=WriteOptions(batch_records=20), after_batch=fail_write_first_attempt,
    )
    # The retry re-sent (duplicate) or skipped the batches the first attempt wrote.
    assert result.duplicate_batches + result.skipped_batches >= 2
    delivered = [str(r.value) for r in read_all(cluster.url, topic)]
    report = compare([f"v{i}" for i in range(400)], delivered)
    assert report.ok, report


def test_a_failed_write_is_aborted_and_invisible(spark: Any, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="sink")
    with pytest.raises(Exception, match="planted permanent fault"):
        write_atomic(
            _rows(spark, 300), cluster.url, uid("w"), topic=topic,
            options=WriteOptions(batch_records=20), after_batch=fail_write_always,
        )
    written = read_all(cluster.url, topic, isolation_level="read_uncommitted")
    assert written, "the tasks wrote batches before the job failed"
    assert read_all(cluster.url, topic) == []


def test_write_commits_source_offsets_in_the_same_transaction(
    spark: Any, cluster: Cluster
) -> None:
    from pyspark.sql import functions as F

    source = cluster.create_topic(partitions=2, prefix="src")
    sink = cluster.create_topic(partitions=2, prefix="sink")
    values = produce_numbers(cluster.url, source, 120)
    group = uid("g")
    ranges = plan_ranges(cluster.url, source, group_id=group)
    df = read_ranges(spark, cluster.url, ranges)
    out = df.select("key", F.concat(F.lit("out:"), "value").alias("value"))
    write_atomic(
        out, cluster.url, uid("w"), topic=sink, group_id=group,
        source_offsets={r.tp: r.end for r in ranges},
    )
    got = [str(r.value).removeprefix("out:") for r in read_all(cluster.url, sink)]
    assert compare(values, got).ok
    with Consumer(cluster.url, group) as consumer:
        committed = consumer.committed([r.tp for r in ranges])
    assert {tp: om.offset for tp, om in committed.items() if om} == {r.tp: r.end for r in ranges}
    assert all(r.empty for r in plan_ranges(cluster.url, source, group_id=group))


def _session(cluster: Cluster, tps: list[TopicPartition]) -> TransactionSession:
    session = TransactionSession(cluster.url, uid("manual"))
    session.init()
    session.add_partitions(tps)
    return session


def test_an_attempt_behind_the_node_skips_what_another_attempt_wrote(cluster: Cluster) -> None:
    """Two attempts of one write task in one slot: the second starts believing nothing is
    written (as a speculative twin that asked before the first got going); its first
    batches are older than the five the node remembers, so they come back out of order,
    and it learns from the node that they are written."""
    topic = cluster.create_topic(partitions=1, prefix="sink")
    tp = TopicPartition(topic, 0)
    session = _session(cluster, [tp])
    assert session.identity is not None
    records = [{"key": f"k{i}", "value": f"v{i}"} for i in range(100)]
    spec = TaskWriteSpec(Connection(cluster.url), topic, binary=False, batch_records=10,
                         batch_bytes=1 << 20, sort=True)  # fmt: skip
    cut = list(cut_batches(records, spec.batch_records, spec.batch_bytes))
    assert len(cut) == 10

    def attempt(written: int) -> SlotSender:
        writer = SequencedPartitionWriter(cluster.url, session.identity)
        sender = SlotSender(writer, tp, spec, slot=3, transactional=True, written=written)
        try:
            for batch in cut:
                sender.send(batch)
        finally:
            writer.close()
        return sender

    first = attempt(written=-1)
    assert (first.duplicates, first.skipped) == (0, 0)
    second = attempt(written=-1)  # stale: it never asked the node
    assert second.duplicates + second.skipped == 10 and second.skipped >= 5
    session.commit()
    assert Counter(str(r.value) for r in read_all(cluster.url, topic)) == Counter(
        f"v{i}" for i in range(100)
    )
    session.close()


def test_a_task_of_an_earlier_write_is_fenced(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="sink")
    tp = TopicPartition(topic, 0)
    session = _session(cluster, [tp])
    assert session.identity is not None
    zombie = SequencedPartitionWriter(cluster.url, session.identity)
    zombie.produce(tp, 0, [{"value": "old"}])
    session.init()  # the next write: a new epoch, the old transaction aborted
    with pytest.raises(ProducerFencedError):
        zombie.produce(tp, 1, [{"value": "late"}])
    assert read_all(cluster.url, topic) == []
    zombie.close()
    session.close()
