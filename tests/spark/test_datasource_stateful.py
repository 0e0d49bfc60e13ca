"""EOS → Structured Streaming → EOS beyond a copy (issue 30, item 6), and bad input:

* a windowed count with a watermark written to EOS in ``append`` mode through
  ``format("eos")`` and in ``update`` mode (the driver SIGKILLed after a batch's write and
  restarted): the sink's final count per window equals the same aggregation computed in
  batch (``spark.read.format("eos")``) over the same input. PySpark's Python data sources
  take append mode only, so update mode goes through ``foreachBatch`` and the batch
  writer with ``writeOnce``;
* ``foreachBatch`` calling ``df.write.format("eos")``: a replayed micro-batch is written
  twice by a plain batch write, once with ``transactionalId`` per batch id and
  ``writeOnce``;
* a coordinator down at start: a clear error on the driver, before any task.
"""

from __future__ import annotations

import socket
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sdk import Producer
from spark_jobs.check import read_all
from spark_jobs.datasource.options import EosOptionError, sink_options
from spark_jobs.datasource.stream_write import KILL_AT_ENV, KILL_MARKER_ENV
from tests.spark.datasource_driver import event_time, window_counts
from tests.spark.helpers import produce_numbers, run_to_end, uid
from tests.spark.test_datasource_driver_kills import (
    JVM_START_S,
    TWO_DRIVERS_TIMEOUT_S,
    start_driver,
)
from tests.support.children import Children
from tests.support.cluster import Cluster

# The streaming lane: beside the "spark" lane, one JVM at a time each (docs/testing.md)
pytestmark = pytest.mark.xdist_group("spark-streaming")

#: Event times far past the others: the record that closes every window before it.
FLUSH_S = 100_000


def produce_events(url: str, topic: str, count: int = 90) -> None:
    """``<event second>:<i>`` with event seconds 0..59 out of order, then one record at
    ``FLUSH_S`` (one partition, so it comes last and nothing before it is late)."""
    with Producer(url, linger_ms=2) as producer:
        for i in range(count):
            producer.send(topic, f"{(i * 7) % 60}:{i}", partition=0)
        producer.send(topic, f"{FLUSH_S}:flush", partition=0)
        producer.flush()


def batch_counts(spark: Any, cluster: Cluster, topic: str) -> dict[str, str]:
    """The same aggregation in batch, over the same input."""
    df = spark.read.format("eos").option("bootstrap", cluster.url).option("subscribe", topic)
    rows = window_counts(event_time(df.load())).collect()
    return {row["key"]: row["value"] for row in rows}


def last_per_window(cluster: Cluster, sink: str) -> dict[str, str]:
    """The sink's last value per window (a window's updates share a key, so a partition,
    and come in offset order)."""
    records = read_all(cluster.url, sink)
    return {str(r.key): str(r.value) for r in sorted(records, key=lambda r: r.offset)}


@pytest.mark.timeout(TWO_DRIVERS_TIMEOUT_S)
def test_update_mode_counts_equal_the_batch_aggregation_across_a_driver_kill(
    spark: Any, cluster: Cluster, tmp_path: Path, children: Children
) -> None:
    source = cluster.create_topic(partitions=1, prefix="st-in")
    sink = cluster.create_topic(partitions=2, prefix="st-upd")
    produce_events(cluster.url, source)
    marker, log = tmp_path / "marker", tmp_path / "driver.log"
    args = ["windows", "--output-mode", "update", "--source", source, "--sink", sink,
            "--prefix", uid("st-upd"), "--checkpoint", str(tmp_path / "ck"),
            "--max-records", "30"]  # fmt: skip
    with pytest.raises(Exception, match="does not support Update mode"):
        (_windows(spark, cluster, source).writeStream.format("eos").outputMode("update")
            .option("bootstrap", cluster.url).option("topic", sink)
            .option("transactionalIdPrefix", uid("st-refused"))
            .option("checkpointLocation", str(tmp_path / "refused"))
            .start().awaitTermination(120))  # fmt: skip
    env = {KILL_AT_ENV: "after_eos_commit", KILL_MARKER_ENV: str(marker)}
    first = start_driver(children, cluster, args, log, **env)
    assert first.wait(timeout=JVM_START_S) != 0, log.read_text()[-3000:]
    assert marker.read_text().split() == ["after_eos_commit", "0"]
    second = start_driver(children, cluster, args, log)
    assert second.wait(timeout=JVM_START_S) == 0, log.read_text()[-3000:]
    expected = batch_counts(spark, cluster, source)
    assert len(expected) == 7  # six windows of ten seconds, and the flush's
    assert last_per_window(cluster, sink) == expected


def _windows(spark: Any, cluster: Cluster, source: str) -> Any:
    stream = (
        spark.readStream.format("eos").option("bootstrap", cluster.url)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "30").load()
    )  # fmt: skip
    return window_counts(event_time(stream).withWatermark("event_time", "10 minutes"))


def test_append_mode_emits_each_closed_window_once_with_the_batch_count(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    source = cluster.create_topic(partitions=1, prefix="st-in")
    sink = cluster.create_topic(partitions=2, prefix="st-app")
    produce_events(cluster.url, source)
    prefix = uid("st-app")
    run_to_end(
        lambda: _windows(spark, cluster, source).writeStream.format("eos")
        .outputMode("append").option("bootstrap", cluster.url).option("topic", sink)
        .option("transactionalIdPrefix", prefix)
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
        .start()
    )  # fmt: skip
    keys = [str(r.key) for r in read_all(cluster.url, sink)]
    assert len(keys) == len(set(keys)), Counter(keys)  # a closed window is emitted once
    expected = batch_counts(spark, cluster, source)
    expected.pop(str(FLUSH_S))  # the flush's own window is still open
    assert last_per_window(cluster, sink) == expected


def _foreach_batch_copy(spark: Any, cluster: Cluster, source: str, sinks: tuple[str, str],
                        name: str, ck: Path) -> list[int]:  # fmt: skip
    """A foreachBatch query writing each batch to ``sinks[0]`` with a plain batch write
    and to ``sinks[1]`` with ``transactionalId`` per batch id and ``writeOnce``."""
    seen: list[int] = []

    def write(df: Any, batch_id: int) -> None:
        seen.append(batch_id)
        out = df.selectExpr("CAST(value AS STRING) AS value")
        for sink, once in zip(sinks, (False, True), strict=True):
            writer = out.write.format("eos").mode("append").option("bootstrap", cluster.url)
            writer = writer.option("topic", sink)
            if once:
                writer = writer.option("transactionalId", f"{name}-{batch_id}")
                writer = writer.option("writeOnce", "true")
            writer.save()

    run_to_end(
        lambda: spark.readStream.format("eos").option("bootstrap", cluster.url)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "20").load()
        .writeStream.foreachBatch(write).option("checkpointLocation", str(ck))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    return seen


def test_foreach_batch_replays_duplicate_unless_the_write_is_write_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    source = cluster.create_topic(partitions=2, prefix="fb-in")
    plain, once = (cluster.create_topic(partitions=2, prefix=p) for p in ("fb-plain", "fb-once"))
    values = produce_numbers(cluster.url, source, 40)
    name, ck = uid("fb-query"), tmp_path / "ck"
    batches = _foreach_batch_copy(spark, cluster, source, (plain, once), name, ck)
    last = max(batches)
    # the driver "died" after the last batch's function and before Spark's commit log
    for file in (str(last), f".{last}.crc"):
        (ck / "commits" / file).unlink(missing_ok=True)
    assert _foreach_batch_copy(spark, cluster, source, (plain, once), name, ck) == [last]

    def delivered(topic: str) -> Counter[str]:
        return Counter(str(r.value) for r in read_all(cluster.url, topic))

    duplicated = delivered(plain) - Counter(values)
    assert duplicated and sum(duplicated.values()) <= 20  # the replayed batch, again
    assert delivered(once) == Counter(values)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_coordinator_down_at_start_fails_on_the_driver_with_a_clear_error(
    spark: Any, tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{_closed_port()}"
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(Exception) as read_error:
        stream = (
            spark.readStream.format("eos").option("bootstrap", down).option("subscribe", "t")
            .load()
        )  # fmt: skip
        query = (
            stream.writeStream.format("console")
            .option("checkpointLocation", str(tmp_path / "ck")).start()
        )  # fmt: skip
        try:
            query.awaitTermination(120)
            raise AssertionError(f"no error: {query.exception()}")
        finally:
            query.stop()
    with pytest.raises(Exception) as write_error:
        spark.createDataFrame([("v",)], "value string").write.format("eos").mode(
            "append"
        ).option("bootstrap", down).option("topic", "t").save()
    # both fail on the driver, at once, naming the address that did not answer and why
    for error in (read_error.value, write_error.value):
        print(type(error).__name__, str(error)[-800:], file=sys.stderr)
        assert "no coordinator of bootstrap answered" in str(error), str(error)[-2000:]
        assert down in str(error) and "Connection refused" in str(error), str(error)[-2000:]
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before


def test_write_once_needs_an_exactly_once_batch_write_with_a_transactional_id() -> None:
    given = {"bootstrap": "http://127.0.0.1:1", "topic": "t", "writeOnce": "true"}
    with pytest.raises(EosOptionError, match="writeOnce"):
        sink_options(given, streaming=False)
    with pytest.raises(EosOptionError, match="writeOnce"):
        sink_options({**given, "transactionalId": "q-1", "mode": "at_least_once"},
                     streaming=False)  # fmt: skip
    assert sink_options({**given, "transactionalId": "q-1"}, streaming=False).write_once
