"""``spark.read.format("eos")``: the Kafka source's columns, read_committed, ranges planned
on the driver and narrowed by pushed filters, and bad options refused before any task."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sdk import Producer, TransactionalProducer
from spark_jobs.datasource import EosOptionError
from spark_jobs.datasource.batch_read import plan, push
from spark_jobs.datasource.options import source_options
from spark_jobs.datasource.planning import Pushed
from tests.spark.helpers import produce_numbers, uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time


@pytest.fixture(scope="module")
def mixed(cluster: Cluster) -> tuple[str, list[str]]:
    """A topic of two partitions: 20 plain records, an aborted transaction of 10, a
    committed one of 6, and 4 binary records with headers; returns it and the visible
    values."""
    topic = cluster.create_topic(partitions=2, prefix="dsr")
    values = produce_numbers(cluster.url, topic, 20)
    with TransactionalProducer(cluster.url, uid("ds-aborter")) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, f"aborted-{i}", key=f"a{i}")
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, f"txn-{i}", key=f"t{i}")
        producer.commit_transaction()
    with Producer(cluster.url) as producer:
        for i in range(4):
            producer.send(topic, b"\x00\xff" + bytes([i]), key=b"bin", headers={"h": f"v{i}"})
        producer.flush()
    return topic, values + [f"txn-{i}" for i in range(6)]


def _reader(spark: Any, cluster: Cluster, **options: str) -> Any:
    return spark.read.format("eos").option("bootstrap", cluster.url).options(**options)


def test_a_batch_read_has_kafkas_columns_and_only_committed_records(
    spark: Any, cluster: Cluster, mixed: tuple[str, list[str]]
) -> None:
    topic, visible = mixed
    df = _reader(spark, cluster, subscribe=topic).load()
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"
    ]
    rows = df.collect()
    texts = sorted(bytes(r["value"]).decode("latin-1") for r in rows if r["key"] != b"bin")
    assert texts == sorted(visible)
    binary = [r for r in rows if r["key"] == b"bin"]
    assert sorted(bytes(r["value"]) for r in binary) == [b"\x00\xff" + bytes([i]) for i in range(4)]
    assert sorted(bytes(r["headers"][0]["value"]) for r in binary) == [b"v0", b"v1", b"v2", b"v3"]
    assert {r["topic"] for r in rows} == {topic} and {r["timestampType"] for r in rows} == {0}
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows)


def test_pushed_filters_plan_fewer_and_shorter_tasks(
    spark: Any, cluster: Cluster, mixed: tuple[str, list[str]]
) -> None:
    from pyspark.sql import functions as F

    topic, _ = mixed
    df = _reader(spark, cluster, subscribe=topic).load()
    assert df.rdd.getNumPartitions() == 2
    one = df.where((F.col("partition") == 1) & (F.col("offset") >= 2) & (F.col("offset") < 5))
    assert one.rdd.getNumPartitions() == 1
    got = sorted((r["partition"], r["offset"]) for r in one.collect())
    assert got and all(p == 1 and 2 <= o < 5 for p, o in got)
    # The plan itself: the driver asks for offsets 2..4 of partition 1 only.
    options = source_options({"bootstrap": cluster.url, "subscribe": topic}, streaming=False)
    pushed = Pushed()
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

    left = push(pushed, [EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 2),
                         LessThan(("offset",), 5)])  # fmt: skip
    assert left == []
    [only] = plan(options, pushed)
    assert (only.partition, only.start, only.end) == (1, 2, 5)


def test_offsets_options_and_split_ranges(
    spark: Any, cluster: Cluster, mixed: tuple[str, list[str]]
) -> None:
    topic, _ = mixed
    ranged = _reader(
        spark, cluster, assign=json.dumps({topic: [0]}),
        startingOffsets=json.dumps({topic: {"0": 1}}), endingOffsets=json.dumps({topic: {"0": 4}}),
    ).load()
    assert sorted(r["offset"] for r in ranged.collect()) == [1, 2, 3]
    split = _reader(spark, cluster, subscribe=topic, maxOffsetsPerTask="5").load()
    assert split.rdd.getNumPartitions() > 2
    assert split.count() == _reader(spark, cluster, subscribe=topic).load().count()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "x", "subscribePatern": "y"}, "unknown option"),
        ({}, "exactly one of subscribe"),
        ({"subscribe": "x", "maxRecordsPerTrigger": "many"}, "not an integer"),
        ({"subscribe": "x", "startingOffsets": "{oops"}, "startingOffsets"),
        ({"subscribe": "no-such-topic-here"}, "do not exist"),
    ],
)
def test_bad_options_fail_on_the_driver(
    cluster: Cluster, options: dict[str, str], message: str
) -> None:
    """The checks the planner runs before any task: the same error Spark shows."""
    with pytest.raises(EosOptionError, match=message):
        parsed = source_options({"bootstrap": cluster.url, **options}, streaming=False)
        plan(parsed, Pushed())


def test_a_bad_option_stops_the_read_before_any_task(spark: Any, cluster: Cluster) -> None:
    tasks_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(Exception, match="no-such-topic"):
        _reader(spark, cluster, subscribe="no-such-topic-ds").load().collect()
    with pytest.raises(Exception, match="unknown option"):
        _reader(spark, cluster, subscribe="x", colour="blue").load().collect()
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == tasks_before


def test_timestamp_filters_are_applied_in_the_task_but_left_to_spark() -> None:
    """EOS has no offsets-for-times index: the plan stays whole, the task drops records
    outside the bounds, and Spark is told to check the filter again."""
    from datetime import UTC, datetime

    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThanOrEqual

    after = GreaterThan(("timestamp",), datetime(2026, 1, 1, tzinfo=UTC))
    before = LessThanOrEqual(("timestamp",), datetime(2026, 1, 2, tzinfo=UTC))
    exact = EqualTo(("partition",), 0)
    listed = In(("offset",), (1, 2))
    pushed = Pushed()
    assert push(pushed, [after, before, exact, listed]) == [after, before, listed]
    assert pushed.min_timestamp_ms == 1_767_225_600_000
    assert pushed.max_timestamp_ms == 1_767_312_000_000
    assert pushed.partitions == {0} and pushed.max_offset is None
