"""``readStream``/``writeStream`` ``format("eos")``: micro-batches bounded by the LSO and cut
by ``maxRecordsPerTrigger``; an EOS → Structured Streaming → EOS copy exactly once, also
when the query restarts from its checkpoint after the driver died between the EOS commit
of a batch and Spark's commit log (the replayed batch is recognised and writes nothing)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk import Consumer, EosError, TopicPartition, TransactionalProducer
from spark_jobs._wire import SequencedPartitionWriter, TransactionSession
from spark_jobs.check import read_all
from spark_jobs.datasource.stream_read import share
from spark_jobs.datasource.stream_write import record_entry
from spark_jobs.examples import stream_copy
from tests.spark.helpers import produce_numbers, run_to_end, uid
from tests.support.children import Children
from tests.support.cluster import Cluster

# The streaming lane: beside the "spark" lane, one JVM at a time each (docs/testing.md)
pytestmark = pytest.mark.xdist_group("spark-streaming")


def _source(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    return (
        spark.readStream.format("eos").option("bootstrap", cluster.url)
        .option("subscribe", topic).option("startingOffsets", "earliest").options(**options)
        .load()
    )  # fmt: skip


def test_available_now_reads_in_limited_batches_below_the_lso(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = cluster.create_topic(partitions=2, prefix="dss")
    values = produce_numbers(cluster.url, topic, 45)
    producer = TransactionalProducer(cluster.url, uid("ds-open"))
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.send(topic, f"undecided-{i}", partition=0)
    producer.flush()  # on the node, undecided: the LSO of partition 0 stays before it
    seen: list[tuple[int, list[str]]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.append((batch_id, [bytes(r["value"]).decode() for r in df.collect()]))

    try:
        run_to_end(
            lambda: _source(spark, cluster, topic, maxRecordsPerTrigger="10").writeStream
            .foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
    finally:
        producer.abort_transaction()
        producer.close()
    sizes = [len(batch) for _, batch in seen if batch]
    assert len(sizes) >= 5 and max(sizes) <= 10, sizes
    assert Counter(v for _, batch in seen for v in batch) == Counter(values)


def _copy(spark: Any, cluster: Cluster, source: str, sink: str, prefix: str, ck: Path) -> Any:
    """The query a Spark user writes: EOS in, a transformation, EOS out."""
    from pyspark.sql import functions as F

    df = _source(spark, cluster, source, maxRecordsPerTrigger="25").select(
        F.col("key").cast("string").alias("key"),
        F.concat(F.lit("out:"), F.col("value").cast("string")).alias("value"),
    )
    return (
        df.writeStream.format("eos").option("bootstrap", cluster.url).option("topic", sink)
        .option("transactionalIdPrefix", prefix).option("checkpointLocation", str(ck))
        .trigger(availableNow=True).start()
    )  # fmt: skip


def _run(start: Callable[[], Any]) -> list[int]:
    return [int(p["batchId"]) for p in run_to_end(start).recentProgress]


def _sink_values(cluster: Cluster, sink: str) -> Counter[str]:
    return Counter(str(r.value).removeprefix("out:") for r in read_all(cluster.url, sink))


def _recorded(cluster: Cluster, prefix: str) -> int | None:
    with Consumer(cluster.url, prefix) as consumer:
        found = consumer.committed([record_entry(prefix)])[record_entry(prefix)]
    return None if found is None else found.offset


def test_a_stream_copies_exactly_once_across_a_replayed_batch(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    source = cluster.create_topic(partitions=2, prefix="dss-in")
    sink = cluster.create_topic(partitions=2, prefix="dss-out")
    prefix, ck = uid("dss-query"), tmp_path / "ck"
    first = produce_numbers(cluster.url, source, 60)
    batches = _run(lambda: _copy(spark, cluster, source, sink, prefix, ck))
    assert len(batches) >= 3
    assert _sink_values(cluster, sink) == Counter(first)
    last = max(batches)
    assert _recorded(cluster, prefix) == last + 1  # the batch id, inside the transactions

    # The driver "dies" after the EOS commit of the last batch and before Spark's commit
    # log: Spark's checkpoint forgets the commit, so the restarted query replays the batch.
    for name in (str(last), f".{last}.crc"):
        (ck / "commits" / name).unlink(missing_ok=True)
    # And a task of the dead driver had begun the next batch: its records are on the node,
    # in that batch's open transaction, never committed.
    zombie = _zombie(cluster, f"{prefix}-{last + 1}", TopicPartition(sink, 0))
    assert len(read_all(cluster.url, sink, isolation_level="read_uncommitted")) == 61
    more = produce_numbers(cluster.url, source, 30, start=1000)
    replayed = _run(lambda: _copy(spark, cluster, source, sink, prefix, ck))
    assert replayed[0] == last, replayed  # the replay ran, and wrote nothing
    assert _sink_values(cluster, sink) == Counter(first + more)  # no zombie record either
    assert _recorded(cluster, prefix) == max(replayed) + 1
    with pytest.raises(EosError):  # the restarted query's new epoch fenced the zombie
        zombie.produce(TopicPartition(sink, 0), 1, [{"value": "out:late"}], slot=7)
    zombie.close()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_source_topic_deleted_while_the_query_runs(
    spark: Any, cluster: Cluster, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """One of two source topics is deleted under a running query: by default the query
    stops before its next batch, saying the topic was deleted; with failOnDataLoss=false it
    goes on with the other (its new records are copied). Either way the sink holds every
    record read, exactly once, and nothing partial."""
    from pyspark.sql import functions as F

    from sdk import AdminClient
    from tests.sdk.helpers import wait_for

    source = cluster.create_topic(partitions=2, prefix="dss-del")
    other = cluster.create_topic(partitions=1, prefix="dss-kept")
    sink = cluster.create_topic(partitions=2, prefix="dss-out")
    values = produce_numbers(cluster.url, source, 40) + produce_numbers(
        cluster.url, other, 10, start=500
    )
    df = _source(
        spark, cluster, f"{source},{other}", failOnDataLoss=str(fail_on_data_loss).lower()
    ).select(
        F.col("key").cast("string").alias("key"),
        F.concat(F.lit("out:"), F.col("value").cast("string")).alias("value"),
    )
    query = (
        df.writeStream.format("eos").option("bootstrap", cluster.url).option("topic", sink)
        .option("transactionalIdPrefix", uid("dss-del"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        wait_for(lambda: _sink_values(cluster, sink) == Counter(values), 120,
                 "the query to copy both sources")  # fmt: skip
        with AdminClient(cluster.url) as admin:
            admin.delete_topic(source)
        if fail_on_data_loss:
            with pytest.raises(Exception, match=rf"topic\(s\) {source} were deleted while "
                               "the query ran"):  # fmt: skip
                query.awaitTermination(120)
        else:
            values += produce_numbers(cluster.url, other, 10, start=600)
            wait_for(lambda: _sink_values(cluster, sink) == Counter(values), 120,
                     "the query to go on with the topic left")  # fmt: skip
            assert query.isActive and query.exception() is None
    finally:
        query.stop()
    assert _sink_values(cluster, sink) == Counter(values)


def _zombie(cluster: Cluster, tid: str, tp: TopicPartition) -> SequencedPartitionWriter:
    """A task of a dead driver: one record written into batch ``tid``'s transaction."""
    session = TransactionSession(cluster.url, tid)
    identity = session.init()
    session.add_partitions([tp])
    session.close()
    writer = SequencedPartitionWriter(cluster.url, identity)
    writer.produce(tp, 0, [{"value": "out:zombie"}], slot=7)
    return writer


def test_a_record_limit_is_shared_in_proportion_to_what_waits() -> None:
    a, b, c = (TopicPartition("t", p) for p in range(3))
    assert share({a: 90, b: 10, c: 0}, 20) == {a: 18, b: 2, c: 0}
    assert share({a: 5, b: 3}, 100) == {a: 5, b: 3}
    assert sum(share({a: 7, b: 7, c: 7}, 10).values()) == 10


@pytest.mark.timeout(600)
def test_the_example_job_runs_with_spark_submit_as_the_docs_say(
    cluster: Cluster, tmp_path: Path, children: Children
) -> None:
    """``spark_jobs/examples/stream_copy.py`` as docs/spark.md submits it (here to
    ``local[2]``): the source copied once, the batch recorded."""
    source = cluster.create_topic(partitions=2, prefix="dse-in")
    sink = cluster.create_topic(partitions=2, prefix="dse-out")
    values = produce_numbers(cluster.url, source, 40)
    name = uid("dse-copy")
    submit = Path(sys.executable).with_name("spark-submit")
    log = tmp_path / "submit.log"
    job = children.start(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.host=127.0.0.1", stream_copy.__file__,
         "--bootstrap", cluster.url, "--source", source, "--sink", sink, "--name", name,
         "--checkpoint", str(tmp_path / "ck"), "--available-now"],
        log=log, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert job.wait(timeout=480) == 0, log.read_text()[-3000:]  # a JVM of its own, loaded
    # the source's value column is binary, so the copy is too: consumers get bytes back
    copied = [bytes(r.value).decode() for r in read_all(cluster.url, sink)]  # type: ignore[arg-type]
    assert Counter(copied) == Counter(values)
    assert (_recorded(cluster, name) or 0) >= 1
