"""The pipeline task's own reading and writing, against the real cluster (no Spark needed):
``RangeReader`` gives what the SDK's consumer gives, and ``BatchWriter`` keeps the
producer's guarantees with batches of thousands of records: numbered from 0 per partition
(a resent batch is a duplicate), every partition added to the transaction before its first
batch, a fenced writer refused whatever its batch size, bytes sent as base64."""

from __future__ import annotations

from collections import Counter

import pytest

from eos_protocol.errors import FatalError
from sdk import AdminClient, Consumer, TopicPartition, TransactionalProducer
from spark_jobs._wire import SequencedPartitionWriter, TransactionSession, init_producer_id
from spark_jobs.batch_writer import BatchOptions, BatchWriter
from spark_jobs.check import read_all
from spark_jobs.reader import RangeReader, iter_range, read_range
from spark_jobs.transforms import OutputRecord
from spark_jobs.writer import default_partition
from tests.spark.helpers import produce_numbers, uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster


def _session(cluster: Cluster) -> TransactionSession:
    session = TransactionSession(cluster.url, uid("task"))
    session.init()
    return session


def test_the_range_reader_reads_what_the_consumer_reads(cluster: Cluster) -> None:
    """Committed records only (an aborted transaction between two writes is skipped, its
    marker too), in offset order, stopping at the planned end, over many small fetches."""
    topic = cluster.create_topic(partitions=1, prefix="src")
    tp = TopicPartition(topic, 0)
    produce_numbers(cluster.url, topic, 120)
    with TransactionalProducer(cluster.url, uid("aborter")) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(30):
            producer.send(topic, f"aborted-{i}", partition=0)
        producer.flush()
        producer.abort_transaction()
    produce_numbers(cluster.url, topic, 50, start=1000)
    with AdminClient(cluster.url) as admin:
        end = admin.list_offsets(tp).last_stable_offset
    with Consumer(cluster.url) as consumer:
        consumer.assign([tp])
        expected = list(iter_range(consumer, tp, 0, end))
    got = [r for batch in read_range(cluster.url, tp, 0, end, max_records=7) for r in batch]
    assert got == expected and len(got) == 170
    assert not any(str(r.value).startswith("aborted") for r in got)
    cut = [r for batch in read_range(cluster.url, tp, 10, 60, max_records=16) for r in batch]
    assert [r.offset for r in cut] == list(range(10, 60))


def test_a_reader_closed_half_way_stops_its_thread(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="src")
    produce_numbers(cluster.url, topic, 100)
    reader = RangeReader(cluster.url, TopicPartition(topic, 0), 0, 100, max_records=5)
    first = next(iter(reader))
    reader.close()
    assert len(first) == 5 and not reader._thread.is_alive()


def test_large_batches_number_every_partition_from_zero(cluster: Cluster) -> None:
    """Many batches on three partitions (keyed placement, as the SDK places keys): the
    node holds each partition's records once, and its last sequence is the count - 1."""
    topic = cluster.create_topic(partitions=3, prefix="sink")
    session = _session(cluster)
    assert session.identity is not None
    writer = BatchWriter(
        cluster.url, session.identity, add_partitions=session.add_partitions,
        options=BatchOptions(batch_records=64),
    )
    try:
        for i in range(1000):
            writer.write(OutputRecord(topic, f"v{i}", f"k{i}"))
        writer.flush()
    finally:
        writer.close()
    assert writer.batches >= 1000 // 64 and writer.duplicates == 0
    probe = SequencedPartitionWriter(cluster.url, session.identity)
    placed = Counter(default_partition(f"k{i}", None, 3) for i in range(1000))
    for p in range(3):
        assert probe.last_sequence(TopicPartition(topic, p)) == placed[p] - 1
    assert read_all(cluster.url, topic) == [], "nothing visible before the commit"
    session.commit()
    records = read_all(cluster.url, topic)
    assert Counter(str(r.value) for r in records) == Counter(f"v{i}" for i in range(1000))
    assert all(r.partition == default_partition(str(r.key), None, 3) for r in records)
    probe.close()
    session.close()


def test_a_fenced_writer_fails_whatever_its_batch_size(cluster: Cluster) -> None:
    """A zombie attempt with one large batch still buffered: its successor's init fences
    it, its flush fails with a fatal error, and nothing of it is ever visible."""
    topic = cluster.create_topic(partitions=1, prefix="sink")
    tid = uid("task")
    zombie_session = TransactionSession(cluster.url, tid)
    identity = zombie_session.init()
    zombie = BatchWriter(
        cluster.url, identity, add_partitions=zombie_session.add_partitions,
        options=BatchOptions(batch_records=100_000),
    )
    for i in range(500):
        zombie.write(OutputRecord(topic, f"early-{i}", partition=0))
    zombie.flush()  # on the node, in the zombie's open transaction
    successor = TransactionSession(cluster.url, tid)
    successor.init()  # fences the zombie and aborts its transaction
    for i in range(5000):
        zombie.write(OutputRecord(topic, f"late-{i}", partition=0))
    with pytest.raises(FatalError):
        zombie.flush()
    zombie.close()
    with pytest.raises(FatalError):
        zombie_session.commit()
    assert read_all(cluster.url, topic) == []
    assert len(read_all(cluster.url, topic, isolation_level="read_uncommitted")) == 500
    for client in (zombie_session, successor):
        client.close()


def test_bytes_travel_as_base64_and_keyless_records_stick(cluster: Cluster) -> None:
    """Idempotent (at-least-once) batches: bytes come back as bytes, text as text."""
    topic = cluster.create_topic(partitions=2, prefix="sink")
    writer = BatchWriter(cluster.url, init_producer_id(cluster.url))
    try:
        writer.write(OutputRecord(topic, b"\x00\xffraw", b"key", 1))
        writer.write(OutputRecord(topic, "text", "key", 1))
        for i in range(10):
            writer.write(OutputRecord(topic, f"keyless-{i}"))
        writer.flush()
    finally:
        writer.close()
    records = read_all(cluster.url, topic)
    values = {(r.partition, r.value) for r in records}
    assert (1, b"\x00\xffraw") in values and (1, "text") in values
    keyless = {r.partition for r in records if str(r.value).startswith("keyless")}
    assert len(keyless) == 1 and len(records) == 12
