"""The stream reader's offsets on the driver, against the real cluster and without a JVM:
ends bounded by the last stable offset, a record limit shared among partitions, new
topics of a pattern picked up from their start, and retention's losses per
``failOnDataLoss``."""

from __future__ import annotations

import logging

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from sdk import AdminClient, TopicPartition, TransactionalProducer
from spark_jobs.datasource.options import source_options
from spark_jobs.datasource.planning import Bounds, check_lost
from spark_jobs.datasource.stream_read import EosStreamReader
from tests.spark.helpers import produce_numbers, uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster


def _reader(cluster: Cluster, **options: str) -> EosStreamReader:
    given = {"bootstrap": cluster.url, "startingOffsets": "earliest", **options}
    return EosStreamReader(source_options(given, streaming=True))


def test_ends_stop_at_an_open_transaction_and_limits_are_shared(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="dso")
    produce_numbers(cluster.url, topic, 20)
    reader = _reader(cluster, subscribe=topic)
    start = reader.initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}
    everything = reader.latestOffset(start, ReadAllAvailable())
    assert sum(everything[topic].values()) == 20
    with TransactionalProducer(cluster.url, uid("dso-open")) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, "undecided", partition=0)
        producer.flush()
        produce_numbers(cluster.url, topic, 10, start=100)  # some land behind it on p0
        held = reader.latestOffset(everything, ReadAllAvailable())
        assert held[topic]["0"] == everything[topic]["0"]  # held at the open transaction
        producer.abort_transaction()
    limited = reader.latestOffset(start, ReadMaxRows(6))
    assert sum(limited[topic].values()) == 6
    assert all(0 < n <= 6 for n in limited[topic].values())  # both partitions get a share
    by_bytes = reader.latestOffset(start, ReadMaxBytes(700))  # ~70 B a record, sampled
    assert 5 <= sum(by_bytes[topic].values()) <= 15
    [piece] = [p.piece for p in reader.partitions(start, limited) if p.piece.partition == 0]
    assert (piece.start, piece.end) == (0, limited[topic]["0"])


def test_a_pattern_picks_up_new_topics_from_their_start(cluster: Cluster) -> None:
    family = uid("dsp")
    first = f"{family}-a"
    with AdminClient(cluster.url) as admin:
        admin.create_topic(first, partitions=1)
    produce_numbers(cluster.url, first, 3)
    reader = _reader(cluster, subscribePattern=f"{family}-.*")
    seen = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert seen == {first: {"0": 3}}
    second = f"{family}-b"
    with AdminClient(cluster.url) as admin:
        admin.create_topic(second, partitions=2)
    produce_numbers(cluster.url, second, 4)
    later = reader.latestOffset(seen, ReadAllAvailable())
    assert later[first] == {"0": 3} and sum(later[second].values()) == 4
    slices = [p.piece for p in reader.partitions(seen, later)]
    assert {(s.topic, s.start) for s in slices} == {(second, 0)}


def test_lost_offsets_fail_or_are_skipped(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    strict = source_options({"bootstrap": cluster.url, "subscribe": "t"}, streaming=True)
    tp = TopicPartition("t", 1)
    with pytest.raises(RuntimeError, match=r"t-1: offsets 5\.\.9 are gone"):
        check_lost(strict, tp, 5, Bounds(10, 20))
    lenient = source_options(
        {"bootstrap": cluster.url, "subscribe": "t", "failOnDataLoss": "false"}, streaming=True
    )
    with caplog.at_level(logging.WARNING):
        assert check_lost(lenient, tp, 5, Bounds(10, 20)) == 10
    assert "skipping to 10" in caplog.text
    assert check_lost(strict, tp, 12, Bounds(10, 20)) == 12
