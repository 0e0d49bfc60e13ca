"""The write tasks of ``format("eos")`` against the real cluster, without a JVM: attempts of
one task (same slot) are duplicates on the node; two tasks (two slots) share a partition;
the driver's check refuses a commit that would be partial; a micro-batch's commit is
recorded once and a replay of it writes nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from spark_jobs.check import read_all
from spark_jobs.datasource.batch_write import EosBatchWriter, adder
from spark_jobs.datasource.options import sink_options
from spark_jobs.datasource.stream_write import EosStreamWriter, next_batch
from spark_jobs.datasource.task_write import Written, check_written, write_task
from tests.spark.helpers import uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster


def _schema() -> object:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("key", StringType()), StructField("value", StringType())])


def _rows(start: int, count: int) -> list[dict[str, str]]:
    return [{"key": f"k{i % 3}", "value": f"v{i}"} for i in range(start, start + count)]


def _arrow(rows: list[dict[str, str]]) -> Iterator[Any]:
    """Rows as an Arrow writer's tasks get them: record batches (of four rows here)."""
    import pyarrow as pa

    return iter([pa.RecordBatch.from_pylist(rows[i : i + 4]) for i in range(0, len(rows), 4)])


def test_attempts_of_a_task_are_duplicates_and_tasks_share_a_partition(
    cluster: Cluster,
) -> None:
    topic = cluster.create_topic(partitions=1, prefix="dst")
    options = sink_options(
        {"bootstrap": cluster.url, "topic": topic, "batchRecords": "7"}, streaming=False
    )
    writer = EosBatchWriter(options, _schema())
    assert writer.identity is not None
    tid, identity = writer.transactional_id, writer.identity
    first = write_task(_rows(0, 50), writer.spec, identity, slot=0,
                       add_partitions=adder(options, tid, identity))  # fmt: skip
    retry = write_task(list(reversed(_rows(0, 50))), writer.spec, identity, slot=0,
                       add_partitions=adder(options, tid, identity))  # fmt: skip
    assert retry.duplicate_batches + retry.skipped_batches == 8  # ceil(50 / 7)
    other = write_task(_rows(50, 30), writer.spec, identity, slot=1,
                       add_partitions=adder(options, tid, identity))  # fmt: skip
    assert read_all(cluster.url, topic) == []
    writer.commit([first, other])
    assert Counter(str(r.value) for r in read_all(cluster.url, topic)) == Counter(
        f"v{i}" for i in range(80)
    )


def test_unsorted_tasks_write_as_rows_come_and_a_retry_in_the_same_order_duplicates(
    cluster: Cluster,
) -> None:
    """``sortWithinTask=false``: batches are cut per partition as the rows arrive (a task
    holds one open batch per partition); a retry over the same input order cuts the same
    batches, which the node answers as duplicates."""
    topic = cluster.create_topic(partitions=2, prefix="dsu")
    options = sink_options(
        {"bootstrap": cluster.url, "topic": topic, "batchRecords": "4",
         "sortWithinTask": "false"},
        streaming=False,
    )  # fmt: skip
    writer = EosBatchWriter(options, _schema())
    assert writer.identity is not None
    tid, identity = writer.transactional_id, writer.identity
    rows = [{"key": f"k{i % 5}", "value": f"v{i}", "partition": i % 2} for i in range(30)]
    first = write_task(rows, writer.spec, identity, slot=3,
                       add_partitions=adder(options, tid, identity))  # fmt: skip
    assert first.records == {(topic, 0): 15, (topic, 1): 15}
    retry = write_task(rows, writer.spec, identity, slot=3,
                       add_partitions=adder(options, tid, identity))  # fmt: skip
    assert retry.duplicate_batches + retry.skipped_batches == 8  # 2 x ceil(15 / 4)
    writer.commit([first])
    by_partition = {p: [str(r.value) for r in read_all(cluster.url, topic) if r.partition == p]
                    for p in (0, 1)}  # fmt: skip
    assert by_partition == {p: [f"v{i}" for i in range(p, 30, 2)] for p in (0, 1)}  # in order


def test_the_driver_refuses_to_commit_what_a_task_did_not_write(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="dst")
    options = sink_options({"bootstrap": cluster.url, "topic": topic}, streaming=False)
    writer = EosBatchWriter(options, _schema())
    assert writer.identity is not None
    claimed = Written(writer.identity.producer_id, writer.identity.producer_epoch, 3,
                      records={(topic, 0): 10})  # fmt: skip
    with pytest.raises(RuntimeError, match="not committing"):
        check_written(options.connection, writer.identity, [claimed])
    with pytest.raises(RuntimeError, match="not committing"):
        writer.commit([claimed])
    assert read_all(cluster.url, topic, isolation_level="read_uncommitted") == []


def test_a_micro_batch_commit_is_recorded_once(cluster: Cluster) -> None:
    """The stream writer's driver steps by hand: prepare (as when PySpark pickles the
    writer for the tasks), the tasks' writes, the commit with the batch id recorded, and a
    second commit of the same batch (a replay) that changes nothing."""
    import pickle

    from spark_jobs.datasource.stream_write import open_identity, transactional_id

    topic = cluster.create_topic(partitions=2, prefix="dst")
    prefix = uid("dst-query")
    options = sink_options(
        {"bootstrap": cluster.url, "topic": topic, "transactionalIdPrefix": prefix},
        streaming=True,
    )
    planner = EosStreamWriter(options, _schema())
    shipped = pickle.loads(pickle.dumps(planner))
    assert shipped.prepared == 0 and next_batch(options) is None
    identity = open_identity(options, 0)
    tid = transactional_id(prefix, 0)
    messages = [
        write_task(_rows(i * 20, 20), shipped.spec, identity, slot=i,
                   add_partitions=adder(options, tid, identity))
        for i in range(2)
    ]  # fmt: skip
    EosStreamWriter(options, _schema()).commit(list(messages), 0)
    assert next_batch(options) == 1
    EosStreamWriter(options, _schema()).commit(list(messages), 0)  # the replay
    assert Counter(str(r.value) for r in read_all(cluster.url, topic)) == Counter(
        f"v{i}" for i in range(40)
    )
    again = pickle.loads(pickle.dumps(EosStreamWriter(options, _schema())))
    assert again.prepared == 1  # the next batch's transaction, for the next tasks
    assert open_identity(options, 1).producer_id != identity.producer_id


def test_at_least_once_tasks_write_at_once_and_again_when_retried(cluster: Cluster) -> None:
    """The benchmark's baseline: no transaction, a producer id per task attempt."""
    topic = cluster.create_topic(partitions=1, prefix="dst")
    options = sink_options(
        {"bootstrap": cluster.url, "topic": topic, "mode": "at_least_once"}, streaming=False
    )
    writer = EosBatchWriter(options, _schema())
    assert writer.identity is None
    writer.write(_arrow(_rows(0, 10)))
    assert len(read_all(cluster.url, topic)) == 10  # visible before any commit
    writer.write(_arrow(_rows(0, 10)))  # a retried attempt: a second copy
    writer.commit([])
    assert Counter(str(r.value) for r in read_all(cluster.url, topic)) == Counter(
        f"v{i}" for i in range(10) for _ in range(2)
    )
