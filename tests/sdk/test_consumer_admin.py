"""The consumer and the admin client against the real cluster, blocking and async."""

from __future__ import annotations

import pytest

from eos_protocol.states import TransactionState
from sdk import (
    IllegalStateError,
    OffsetAndMetadata,
    TopicAlreadyExistsError,
    TopicPartition,
    TransactionalIdNotFoundError,
)
from tests.sdk.conftest import Twin
from tests.sdk.helpers import uid, wait_for
from tests.support.cluster import Cluster


def _interleaved(twin: Twin, cluster: Cluster, topic: str) -> None:
    """c0 c1 M | a0 a1 M (aborted) | c2 c3 M: gaps of markers and aborted data to skip."""
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    for label, commit in (("c0 c1", True), ("a0 a1", False), ("c2 c3", True)):
        producer.begin_transaction()
        for value in label.split():
            producer.send(topic, value, partition=0)
        if commit:
            producer.commit_transaction()
        else:
            producer.flush()
            producer.abort_transaction()


def test_poll_follows_next_offset_across_gaps(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    _interleaved(twin, cluster, topic)
    consumer = twin.consumer(cluster.url, max_poll_records=1)
    consumer.assign([(topic, 0)])
    seen: list[str] = []

    def all_four() -> bool:
        seen.extend(r.value for r in consumer.poll(timeout=0.2))
        return len(seen) >= 4

    wait_for(all_four, what="the committed records")
    assert seen == ["c0", "c1", "c2", "c3"]  # never an aborted record, never a marker
    assert consumer.poll(timeout=0.1) == []
    assert consumer.position((topic, 0)) == 9  # past 4 records, 2 aborted ones and 3 markers

    uncommitted = twin.consumer(cluster.url, isolation_level="read_uncommitted")
    uncommitted.assign([TopicPartition(topic, 0)])
    every = wait_for(lambda: (r := uncommitted.poll(timeout=0.3)) and r, what="records")
    assert [r.value for r in every][:6] == ["c0", "c1", "a0", "a1", "c2", "c3"]


def test_seek_position_commit_and_committed(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2)
    producer = twin.producer(cluster.url)
    for i in range(6):
        producer.send(topic, str(i), partition=i % 2)
    producer.flush()

    group = uid("group")
    consumer = twin.consumer(cluster.url, group, isolation_level="read_uncommitted")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer.assign([tp0, tp1])
    assert consumer.position(tp0) == 0  # no committed offset: earliest
    consumer.seek(tp1, 2)
    records = wait_for(lambda: consumer.poll(timeout=0.5), what="records")
    got = {(r.partition, r.value) for r in records}
    assert (1, "5") in got and (1, "1") not in got
    consumer.commit()
    committed = consumer.committed()
    assert committed[tp1] == OffsetAndMetadata(consumer.position(tp1), None)
    consumer.commit({tp0: OffsetAndMetadata(1, "note")})
    assert consumer.committed([tp0])[tp0] == OffsetAndMetadata(1, "note")

    again = twin.consumer(cluster.url, group, isolation_level="read_uncommitted")
    again.assign([tp0])
    assert again.position(tp0) == 1  # resumes from the committed offset
    with pytest.raises(IllegalStateError):
        again.seek(tp1, 0)  # not assigned
    with pytest.raises(IllegalStateError):
        twin.consumer(cluster.url).commit()  # no group


def test_latest_reset_starts_at_the_end(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    producer = twin.producer(cluster.url)
    producer.send(topic, "old").result()
    consumer = twin.consumer(cluster.url, auto_offset_reset="latest")
    consumer.assign([(topic, 0)])
    assert consumer.position((topic, 0)) == 1
    producer.send(topic, "new").result()
    records = wait_for(lambda: consumer.poll(timeout=0.5), what="the new record")
    assert [r.value for r in records] == ["new"]


def test_admin_topics_and_cluster(twin: Twin, cluster: Cluster) -> None:
    admin = twin.admin(cluster.url)
    name = uid("admin")
    info = admin.create_topic(name, 3)
    assert [p.partition for p in info.partitions] == [0, 1, 2]
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic(name, 3)
    assert admin.create_topic(name, 3, exist_ok=True).name == name
    described = admin.describe_cluster()
    assert {n.url for n in described.nodes} == {n.url for n in cluster.nodes}
    assert name in {t.name for t in described.topics}
    offsets = admin.list_offsets((name, 0))
    assert offsets.high_watermark == 0
    assert admin.find_coordinator("g", "group").url in {n.url for n in cluster.nodes}


def test_admin_transactions(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    admin = twin.admin(cluster.url)
    tid = uid("hanging")
    producer = twin.transactional_producer(cluster.url, tid)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, "stuck").result()

    described = admin.describe_transaction(tid)
    assert described.state is TransactionState.ONGOING
    assert described.producer_id == producer.producer_id
    assert tid in {t.transactional_id for t in admin.list_transactions(state="Ongoing")}
    holders = admin.describe_producers((topic, 0))
    assert any(p.producer_id == producer.producer_id and p.current_txn_start_offset == 0
               for p in holders)

    assert admin.abort_transaction(tid) in (TransactionState.PREPARE_ABORT,
                                            TransactionState.COMPLETE_ABORT)
    wait_for(lambda: admin.describe_transaction(tid).state is TransactionState.COMPLETE_ABORT,
             what="the forced abort to complete")
    assert admin.list_offsets((topic, 0)).last_stable_offset >= 1  # no longer held back
    with pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transaction(uid("unknown"))
