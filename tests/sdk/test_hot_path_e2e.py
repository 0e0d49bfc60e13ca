"""``send_many`` and the consumer's fetches ahead against a real coordinator and storage
node, each test with the blocking and the async clients: order and futures of a list,
a retried list deduplicated by the node, lists in transactions, and positions, seeks and
assignments while fetches ahead are under way, read_committed throughout."""

from __future__ import annotations

from typing import Any

from sdk import RecordMetadata, RetryConfig, TopicPartition
from tests.sdk.cluster import Cluster
from tests.sdk.conftest import Twin
from tests.sdk.faults import is_produce
from tests.sdk.helpers import read_topic, uid, values

FAST = RetryConfig(backoff_ms=10, backoff_max_ms=50, request_timeout_ms=5_000)


def results(twin: Twin, futures: Any) -> list[RecordMetadata]:
    """Every record's metadata of a ``send_many`` (the async one's are awaited)."""
    if twin.kind == "sync":
        out: list[RecordMetadata] = futures.results(60)
        return out
    got: list[RecordMetadata] = twin.bridge.run(futures.results())
    return got


def test_send_many_keeps_order_and_gives_each_record_its_metadata(
    twin: Twin, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=3)
    sent = [f"v{i:04d}" for i in range(1500)]
    keys = [f"k{i % 5}" for i in range(1500)]
    with twin.producer(cluster.url, batch_size=4096) as producer:
        futures = producer.send_many(topic, sent, keys=keys)
        assert len(futures) == len(sent)
        producer.flush()
        metas = results(twin, futures)
    by_partition: dict[int, list[tuple[int, str]]] = {}
    for meta, value, key in zip(metas, sent, keys, strict=True):
        assert meta.topic == topic and not meta.duplicate
        by_partition.setdefault(meta.partition, []).append((meta.offset, value))
        assert all(m.partition == meta.partition for m, k in zip(metas, keys, strict=True)
                   if k == key)  # a key always lands on one partition
    for placed in by_partition.values():
        offsets = [offset for offset, _ in placed]
        assert offsets == sorted(offsets)  # list order is log order in each partition
    records = read_topic(cluster.url, topic, 3, expect=len(sent),
                         isolation_level="read_uncommitted")
    assert sorted(values(records)) == sent
    for record in records:
        assert (record.offset, record.value) in by_partition[record.partition]


def test_a_list_retried_after_a_lost_answer_is_written_once(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1)
    lost: list[str] = []

    def plan(request: Any) -> str | None:
        if is_produce(request) and not lost:
            lost.append("drop")
            return "drop"  # the node writes the first batch, its answer is lost
        return None

    server = twin.faulty(plan)
    sent = [f"r{i}" for i in range(300)]
    with twin.producer(cluster.url, retry=FAST, transport=server.transport(twin.kind)) as p:
        futures = p.send_many(topic, sent, partition=0)
        p.flush()
        metas = results(twin, futures)
    assert server.injected["drop"] == 1
    assert any(m.duplicate for m in metas), "the retry must come back duplicate"
    assert [m.offset for m in metas] == list(range(300))
    records = read_topic(cluster.url, topic, 1, expect=300, isolation_level="read_uncommitted")
    assert values(records) == sent


def test_send_many_in_transactions(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2)
    producer = twin.transactional_producer(cluster.url, uid("tx"))
    producer.init_transactions()
    producer.begin_transaction()
    committed = producer.send_many(topic, [f"c{i}" for i in range(400)])
    producer.send(topic, "single")
    producer.commit_transaction()
    assert len(results(twin, committed)) == 400
    producer.begin_transaction()
    producer.send_many(topic, [f"a{i}" for i in range(200)], partition=1)
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send_many(topic, ["after"], partition=0)
    producer.commit_transaction()
    seen = values(read_topic(cluster.url, topic, 2, expect=402))
    assert sorted(seen) == sorted([f"c{i}" for i in range(400)] + ["single", "after"])


def _fill(twin: Twin, cluster: Cluster, topic: str) -> list[str]:
    """Committed and aborted transactions alternating on partition 0; the committed
    values, in order."""
    producer = twin.transactional_producer(cluster.url, uid("fill"))
    producer.init_transactions()
    committed: list[str] = []
    for n in range(6):
        producer.begin_transaction()
        batch = [f"t{n}-{i}" for i in range(700)]
        producer.send_many(topic, batch, partition=0)
        if n % 3 == 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += batch
    producer.close()
    return committed


def test_consumer_reads_ahead_read_committed_and_keeps_positions(
    twin: Twin, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=1)
    committed = _fill(twin, cluster, topic)
    tp = TopicPartition(topic, 0)
    committed_offsets = [r.offset for r in read_topic(cluster.url, topic, 1,
                                                      expect=len(committed))]
    with twin.consumer(cluster.url, uid("g"), max_poll_records=250) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[Any] = []
        while len(got) < len(committed):
            batch = consumer.poll(timeout=5.0)
            assert batch, "records stopped before the end"
            got += batch
            # the next record the application gets: past this poll's last, never past
            # a record fetched ahead but not yet handed out
            position = consumer.position(tp)
            assert position >= batch[-1].offset + 1
            if len(got) < len(committed):
                assert position <= committed_offsets[len(got)]
        assert values(got) == committed  # no aborted record, none twice, in order
        consumer.commit()
        end = consumer.position(tp)
        assert consumer.committed([tp])[tp].offset == end
        assert consumer.poll(timeout=0.2) == []


def test_seek_and_assign_while_fetches_ahead_are_under_way(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2)
    committed = _fill(twin, cluster, topic)
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with twin.consumer(cluster.url, max_poll_records=100) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        first = consumer.poll(timeout=5.0)  # leaves fetches ahead running past it
        assert values(first) == committed[: len(first)]
        consumer.seek(tp, first[10].offset)  # back: what was fetched ahead is not used
        again = consumer.poll(timeout=5.0)
        assert again[0].offset == first[10].offset
        assert values(again) == committed[10 : 10 + len(again)]
        later = committed.index("t3-0")
        middle = next(r for r in read_topic(cluster.url, topic, 1, expect=len(committed))
                      if r.value == "t3-0")
        consumer.seek(tp, middle.offset)  # forward, past the aborted transaction
        ahead = consumer.poll(timeout=5.0)
        assert values(ahead) == committed[later : later + len(ahead)]
        consumer.assign([other])  # let partition 0 go while its fetches ahead run
        consumer.seek(other, 0)
        assert consumer.poll(timeout=0.5) == []  # partition 1 has no records
        consumer.assign([other, tp])
        consumer.seek(tp, middle.offset)
        rest: list[Any] = []
        while len(rest) < len(committed) - later:
            batch = consumer.poll(timeout=5.0)
            assert batch
            rest += batch
        assert values(rest) == committed[later:]
