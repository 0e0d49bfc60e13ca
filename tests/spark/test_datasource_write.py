"""``df.write.format("eos")``: the whole DataFrame in one transaction owned by the driver,
several tasks writing one partition in slots of their own; a failed job leaves nothing;
a DataFrame or an option the sink cannot take fails before any task."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from spark_jobs.check import read_all
from spark_jobs.datasource import EosOptionError
from spark_jobs.datasource.options import sink_options
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time


def _rows(spark: Any, count: int, slices: int = 3) -> Any:
    data = [(f"k{i % 7}", f"v{i}") for i in range(count)]
    return spark.createDataFrame(data, "key string, value string").repartition(slices)


def _writer(df: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    return (
        df.write.format("eos").mode("append")
        .option("bootstrap", cluster.url).option("topic", topic).options(**options)
    )  # fmt: skip


def test_a_written_dataframe_reads_back_once(spark: Any, cluster: Cluster) -> None:
    """Three tasks, seven keys on two partitions: every partition is written by several
    tasks, each in its own slot, all in the one transaction the driver commits."""
    topic = cluster.create_topic(partitions=2, prefix="dsw")
    _writer(_rows(spark, 300), cluster, topic, batchRecords="16").save()
    records = read_all(cluster.url, topic)
    assert Counter(str(r.value) for r in records) == Counter(f"v{i}" for i in range(300))
    back = spark.read.format("eos").option("bootstrap", cluster.url).option("subscribe", topic)
    texts = back.load().selectExpr("CAST(value AS STRING) AS v").collect()
    assert sorted(r["v"] for r in texts) == sorted(f"v{i}" for i in range(300))


def test_binary_values_and_kafka_headers_round_trip(spark: Any, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="dsw")
    df = spark.createDataFrame(
        [(bytearray(b"\x00k"), bytearray(b"\xff\x00" + bytes([i])), [("h", bytearray(b"x"))])
         for i in range(5)],
        "key binary, value binary, headers array<struct<key: string, value: binary>>",
    )  # fmt: skip
    _writer(df, cluster, topic).save()
    back = spark.read.format("eos").option("bootstrap", cluster.url).option("subscribe", topic)
    rows = back.load().collect()
    assert sorted(bytes(r["value"]) for r in rows) == [b"\xff\x00" + bytes([i]) for i in range(5)]
    assert {bytes(r["key"]) for r in rows} == {b"\x00k"}
    assert {(r["headers"][0]["key"], bytes(r["headers"][0]["value"])) for r in rows} == {
        ("h", b"x")
    }


def _fail_on(value: str) -> Any:
    def check(v: str) -> str:
        if v == value:
            raise RuntimeError("planted permanent fault in a write task")
        return v

    return check


def test_a_failed_write_is_aborted_and_invisible(spark: Any, cluster: Cluster) -> None:
    from pyspark.sql import functions as F

    topic = cluster.create_topic(partitions=2, prefix="dsw")
    fail = F.udf(_fail_on("v250"), "string", useArrow=False)
    df = _rows(spark, 300).select("key", fail("value").alias("value"))
    with pytest.raises(Exception, match="planted permanent fault"):
        _writer(df, cluster, topic).save()
    assert read_all(cluster.url, topic) == []


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ("key string, payload string", {}, "needs a 'value' column"),
        ("key string, value int", {}, "column value must be string or binary"),
        ("value string", {"topic": "no-such-topic-dsw"}, "does not exist"),
        ("value string", {"mode": "twice"}, "option mode"),
        ("value string", {"transactionalid": "x", "lingerMs": "5"}, "unknown option"),
        ("value string", {"sendOffsets": '{"t": {"0": 5}}'}, "go together"),
        ("value string", {"sendOffsets": "latest", "sendOffsetsGroupId": "g"},
         "next offset to read"),
        ("value string", {"sendOffsets": '{"t": {"0": 5}}', "sendOffsetsGroupId": "g",
                          "mode": "at_least_once"}, "exactly-once batch"),
    ],
)
def test_a_write_the_sink_cannot_take_fails_before_any_task(
    spark: Any, cluster: Cluster, columns: str, options: dict[str, str], message: str
) -> None:
    topic = cluster.create_topic(partitions=1, prefix="dsw")
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        df.write.format("eos").mode("append").option("bootstrap", cluster.url).options(
            **{"topic": topic, **options}
        ).save()
    assert read_all(cluster.url, topic) == []


def test_source_offsets_commit_with_the_output_and_alone_when_it_is_empty(
    spark: Any, cluster: Cluster
) -> None:
    """``sendOffsets``: a batch consume-transform-produce job's input offsets commit in the
    write's transaction (read stably: visible with the output); a write with no row still
    moves them (a transform that filtered everything out)."""
    from sdk import Consumer, TopicPartition

    topic = cluster.create_topic(partitions=2, prefix="dsw")
    source = TopicPartition("dsw-source", 1)
    group = f"dsw-group-{topic}"

    def committed() -> int | None:
        with Consumer(cluster.url, group) as consumer:
            found = consumer.committed([source], require_stable=True)[source]
        return None if found is None else found.offset

    offsets = '{"dsw-source": {"1": 40}}'
    _writer(_rows(spark, 50), cluster, topic, sendOffsets=offsets,
            sendOffsetsGroupId=group).save()  # fmt: skip
    assert committed() == 40
    assert len(read_all(cluster.url, topic)) == 50
    empty = spark.createDataFrame([], "key string, value string")
    _writer(empty, cluster, topic, sendOffsets='{"dsw-source": {"1": 75}}',
            sendOffsetsGroupId=group).save()  # fmt: skip
    assert committed() == 75
    assert len(read_all(cluster.url, topic)) == 50


def test_a_stream_sink_needs_its_prefix(cluster: Cluster) -> None:
    with pytest.raises(EosOptionError, match="transactionalIdPrefix"):
        sink_options({"bootstrap": cluster.url, "topic": "t"}, streaming=True)
    relaxed = sink_options(
        {"bootstrap": cluster.url, "topic": "t", "mode": "at_least_once"}, streaming=True
    )
    assert not relaxed.exactly_once
    with pytest.raises(EosOptionError, match="a stream's offsets are in its checkpoint"):
        sink_options({"bootstrap": cluster.url, "topic": "t", "transactionalIdPrefix": "q",
                      "sendOffsets": '{"t": {"0": 1}}', "sendOffsetsGroupId": "g"},
                     streaming=True)  # fmt: skip
