"""The transactional and idempotent producers against a real coordinator and real storage
nodes (KIP-890 verification on), each test run with the blocking and the async clients."""

from __future__ import annotations

import pytest

from sdk import (
    IllegalStateError,
    OffsetAndMetadata,
    ProducerFencedError,
    ProducerState,
    TopicPartition,
)
from tests.sdk.cluster import Cluster
from tests.sdk.conftest import Twin
from tests.sdk.helpers import read_topic, uid, values, wait_for


def test_committed_transaction_is_visible_and_aborted_one_never(
    twin: Twin, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=3)
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    assert producer.state is ProducerState.READY

    producer.begin_transaction()
    committed = [producer.send(topic, f"c{i}", key=f"k{i}") for i in range(30)]
    producer.commit_transaction()
    offsets = [f.result().offset for f in committed]
    assert all(o >= 0 for o in offsets)

    producer.begin_transaction()
    aborted = [producer.send(topic, f"a{i}", key=f"k{i}") for i in range(30)]
    producer.flush()
    assert all(f.result().offset >= 0 for f in aborted)  # written, then aborted
    producer.abort_transaction()

    producer.begin_transaction()
    producer.send(topic, "after", partition=0)
    producer.commit_transaction()

    seen = read_topic(cluster.url, topic, 3, expect=31)
    assert sorted(values(seen)) == sorted([f"c{i}" for i in range(30)] + ["after"])
    raw = read_topic(cluster.url, topic, 3, expect=61, isolation_level="read_uncommitted")
    assert len(raw) == 61  # the aborted records are in the log, only hidden
    assert producer.state is ProducerState.READY


def test_transaction_block_aborts_on_exception(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    with pytest.raises(RuntimeError, match="boom"), producer.transaction():
        producer.send(topic, "lost")
        producer.flush()
        raise RuntimeError("boom")
    assert producer.state is ProducerState.READY
    with producer.transaction():
        producer.send(topic, "kept")
    assert values(read_topic(cluster.url, topic, 1, expect=1)) == ["kept"]


def test_calls_out_of_order_are_refused(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()  # before init_transactions
    producer.init_transactions()
    with pytest.raises(IllegalStateError):
        producer.send(topic, "no transaction")
    with pytest.raises(IllegalStateError):
        producer.commit_transaction()
    producer.begin_transaction()
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()
    producer.commit_transaction()  # added nothing: no call to the coordinator
    assert producer.state is ProducerState.READY


def test_second_producer_fences_the_first(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    tid = uid("tx")
    first = twin.transactional_producer(cluster.url, tid)
    first.init_transactions()
    first.begin_transaction()
    first.send(topic, "zombie").result()

    second = twin.transactional_producer(cluster.url, tid)
    second.init_transactions()  # fences the first and aborts its open transaction
    assert second.producer_epoch > first.producer_epoch

    with pytest.raises(ProducerFencedError):
        first.commit_transaction()
    assert first.state is ProducerState.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        first.begin_transaction()

    with second.transaction():
        second.send(topic, "winner")
    assert values(read_topic(cluster.url, topic, 1, expect=1)) == ["winner"]


def test_offsets_commit_atomically_with_the_data(twin: Twin, cluster: Cluster) -> None:
    source, sink = cluster.create_topic(partitions=1), cluster.create_topic(partitions=1)
    group = uid("group")
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    consumer = twin.consumer(cluster.url, group)
    tp = TopicPartition(source, 0)
    consumer.assign([tp])

    producer.begin_transaction()
    producer.send(sink, "out-1")
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(7, "m")}, group)
    producer.abort_transaction()
    assert consumer.committed([tp]) == {tp: None}

    producer.begin_transaction()
    producer.send(sink, "out-2")
    producer.send_offsets_to_transaction({(source, 0): 9}, group)
    producer.commit_transaction()
    # require_stable waits out the pending offsets, then sees them with the data
    assert consumer.committed([tp], require_stable=True)[tp] == OffsetAndMetadata(9, None)
    assert values(read_topic(cluster.url, sink, 1, expect=1)) == ["out-2"]


def test_idempotent_producer_keeps_order_per_partition(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2)
    producer = twin.producer(cluster.url, linger_ms=1, batch_size=2_000)
    futures = [producer.send(topic, str(i), key=f"k{i % 4}") for i in range(400)]
    producer.flush()
    metas = [f.result() for f in futures]
    assert producer.producer_id >= 0
    for key in range(4):
        mine = [m for i, m in enumerate(metas) if i % 4 == key]
        assert len({m.partition for m in mine}) == 1  # a key always lands on one partition
        assert [m.offset for m in mine] == sorted(m.offset for m in mine)
    seen = read_topic(cluster.url, topic, 2, expect=400, isolation_level="read_uncommitted")
    assert sorted(int(v) for v in values(seen)) == list(range(400))


def test_binary_values_round_trip(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    producer = twin.producer(cluster.url)
    producer.send(topic, b"\x00\xffbinary", key=b"\x01").result()
    producer.send(topic, "text", headers={"h": "v"}).result()
    seen = read_topic(cluster.url, topic, 1, expect=2, isolation_level="read_uncommitted")
    assert [(r.key, r.value) for r in seen] == [(b"\x01", b"\x00\xffbinary"), (None, "text")]
    assert seen[1].headers == {"h": "v"}


def test_commit_waits_for_markers_before_next_transaction(twin: Twin, cluster: Cluster) -> None:
    """Back-to-back transactions: the next add-partitions meets CONCURRENT_TRANSACTIONS
    while the markers of the previous commit are written, and is retried quickly."""
    topic = cluster.create_topic(partitions=2)
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    for n in range(5):
        with producer.transaction():
            for i in range(10):
                producer.send(topic, f"{n}-{i}")
    seen = wait_for(lambda: len(read_topic(cluster.url, topic, 2)) == 50 or None,
                    what="50 committed records")
    assert seen


def test_several_batches_of_a_partition_are_in_flight_without_reordering(
    twin: Twin, cluster: Cluster
) -> None:
    """Up to five batches per partition await their answers together; one that the node
    handled before its predecessor (HTTP/1.1 requests on separate connections) is sent
    again, so the offsets still follow the order of the sends."""
    topic = cluster.create_topic(partitions=1)
    server = twin.faulty(lambda request: None)
    producer = twin.producer(cluster.url, linger_ms=0, batch_size=2_000,
                             transport=server.transport(twin.kind))
    futures = [producer.send(topic, "x" * 900) for _ in range(600)]
    producer.flush()
    assert [f.result().offset for f in futures] == list(range(600))
    assert 1 < server.max_concurrent["produce"] <= 5


def test_pipelined_transactions_back_to_back(twin: Twin, cluster: Cluster) -> None:
    """At the start of each transaction the node verifies the partition with the
    coordinator and may handle a later batch before an earlier one; the producer resends
    the overtaking batch and the transactions commit whole."""
    topic = cluster.create_topic(partitions=2)
    producer = twin.transactional_producer(cluster.url, uid("tx"), linger_ms=0,
                                           batch_size=2_000)
    producer.init_transactions()
    for n in range(8):
        with producer.transaction():
            for i in range(120):
                producer.send(topic, f"{n}:{i}", partition=i % 2)
    records = read_topic(cluster.url, topic, 2, expect=960)
    for partition in (0, 1):
        got = [r.value for r in records if r.partition == partition]
        assert got == [f"{n}:{i}" for n in range(8) for i in range(partition, 120, 2)]
