"""The Spark writers' last sequences of many (partition, slot) pairs through the tasks' wire
client (``SequencedPartitionWriter.last_sequences``) against the Spark modules' real
cluster (three nodes, every partition on all three; no Spark needed), with requests
counted at the client's transport seam (an ``httpx`` transport in front of the real one).

Shown here: one request per leader node answers every pair as the per-partition GET does;
a pair sent to a node that no longer leads its partition is looked up again and asked of
the leader, alone; a node that answers the request 404 or 405 (an earlier release) is asked
per partition, and remembered; a write task asks once per node when it starts; and the
driver's check (``check_written``, of the data source and of ``write_atomic``) asks once
per node and still refuses a batch missing or a second copy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from eos_protocol.errors import CATALOGUE
from sdk import TopicPartition
from sdk._config import RetryConfig
from sdk._metadata import DESCRIBE_PRODUCERS_MANY_PATH
from sdk._transport import SyncTransport
from spark_jobs import _wire
from spark_jobs._wire import SequencedPartitionWriter, SlotKey, TransactionSession
from spark_jobs.datasource.batch_write import EosBatchWriter, adder
from spark_jobs.datasource.options import sink_options
from spark_jobs.datasource.task_write import Written, check_written, write_task
from tests.spark.helpers import uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster
PARTITIONS = 6
GET_PRODUCERS = "GET /producers"
DESCRIBE = f"POST {DESCRIBE_PRODUCERS_MANY_PATH}"


class Counted(httpx.BaseTransport):
    """The transport seam: counts the describe requests (the many-partition POST, and the
    per-partition GETs under one key) and the error codes of the POST's entries; with
    ``refuse``, answers the POST with that status, as a node of an earlier release does."""

    def __init__(self, refuse: int | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.refuse = refuse
        self.requests: Counter[str] = Counter()
        self.entry_errors: Counter[str] = Counter()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        key = GET_PRODUCERS if path.endswith("/producers") else f"{request.method} {path}"
        self.requests[key] += 1
        if key == DESCRIBE and self.refuse is not None:
            error = {"code": "NOT_FOUND" if self.refuse == 404 else "INVALID_REQUEST",
                     "message": "no such route", "retriable": False}  # fmt: skip
            return httpx.Response(self.refuse, json={"error": error})
        response = self.inner.handle_request(request)
        if key == DESCRIBE and response.status_code == 200:
            for entry in orjson.loads(response.read())["partitions"]:
                if entry["error"] is not None:
                    self.entry_errors[entry["error"]["code"]] += 1
        return response

    def close(self) -> None:
        self.inner.close()


def counted(client: SequencedPartitionWriter, refuse: int | None = None) -> Counted:
    """``client``'s requests through a ``Counted`` seam from now on."""
    seam = Counted(refuse)
    old = client.http
    client.http = SyncTransport(old.retry, transport=seam)
    client.http.on_unreachable = old.on_unreachable
    old.close()
    return seam


def route_every_client(monkeypatch: pytest.MonkeyPatch, seam: Counted) -> None:
    """Every wire client made from now on (inside a task or a check) goes through
    ``seam``."""

    class Through(SyncTransport):
        def __init__(self, retry: RetryConfig, **kwargs: Any) -> None:
            super().__init__(retry, transport=seam, **kwargs)

    monkeypatch.setattr(_wire, "SyncTransport", Through)


@dataclass(frozen=True)
class Setup:
    """A topic written in slots under one transaction, by ``writer``; ``expected``: the
    last sequence of every (partition, slot) pair the tests ask."""

    topic: str
    writer: SequencedPartitionWriter
    expected: dict[SlotKey, int]


@pytest.fixture
def written(cluster: Cluster) -> Iterator[Setup]:
    """A transaction's partitions written in slots: partition p holds p + 1 records in
    slot 1; the even ones 1 in slot 2; nothing without a slot (pairs of slots 1, 2 and
    none are asked)."""
    topic = cluster.create_topic(partitions=PARTITIONS, prefix="lastseq")
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    session = TransactionSession(cluster.url, uid("driver"))
    identity = session.init()
    session.add_partitions(tps)
    writer = SequencedPartitionWriter(cluster.url, identity)
    expected: dict[SlotKey, int] = {}
    for tp in tps:
        records = [{"value": f"{tp.partition}-{i}"} for i in range(tp.partition + 1)]
        writer.produce(tp, 0, records, slot=1)
        expected[(tp, 1)] = tp.partition
        if tp.partition % 2 == 0:
            writer.produce(tp, 0, [{"value": "two"}], slot=2)
        expected[(tp, 2)] = 0 if tp.partition % 2 == 0 else -1
        expected[(tp, None)] = -1
    try:
        yield Setup(topic, writer, expected)
    finally:
        session.abort()
        writer.close()
        session.close()


def leader_nodes(client: SequencedPartitionWriter, tps: list[TopicPartition]) -> set[str]:
    return {client.leader(tp) for tp in tps}


def test_one_request_per_node_answers_every_pair(cluster: Cluster, written: Setup) -> None:
    expected = written.expected
    probe = SequencedPartitionWriter(cluster.url, written.writer.identity)
    seam = counted(probe)
    try:
        nodes = leader_nodes(probe, [tp for tp, _ in expected])
        assert len(nodes) > 1
        found = probe.last_sequences(expected)
        assert found == expected
        assert seam.requests[DESCRIBE] == len(nodes) < len(expected)
        assert seam.requests[GET_PRODUCERS] == 0
        # the per-partition GET, one request a pair, answers the same
        assert {key: probe.last_sequence(key[0], slot=key[1]) for key in expected} == found
        assert seam.requests[GET_PRODUCERS] == len(expected)
    finally:
        probe.close()


def test_a_pair_sent_to_a_node_that_does_not_lead_is_asked_again(
    cluster: Cluster, written: Setup
) -> None:
    """The client's metadata names a follower as the leader of half the partitions: those
    entries come back NOT_LEADER_OR_FOLLOWER, the topic is looked up again, and only they
    are asked again, of their leaders."""
    topic, expected = written.topic, written.expected
    probe = SequencedPartitionWriter(cluster.url, written.writer.identity)
    seam = counted(probe)
    try:
        urls = [node.url.rstrip("/") for node in cluster.nodes]
        truth = [probe.leader(TopicPartition(topic, p)) for p in range(PARTITIONS)]
        wrong = [next(u for u in urls if u != truth[p]) if p < 3 else truth[p]
                 for p in range(PARTITIONS)]  # fmt: skip
        probe.metadata.update_topic({"name": topic, "partitions": [
            {"partition": p, "leader": {"url": url}} for p, url in enumerate(wrong)]})  # fmt: skip
        seam.requests.clear()
        assert CATALOGUE["NOT_LEADER_OR_FOLLOWER"].retriable
        assert probe.last_sequences(expected) == expected
        assert seam.entry_errors == {"NOT_LEADER_OR_FOLLOWER": 3 * 3}  # 3 partitions x 3 slots
        assert seam.requests[f"GET /v1/topics/{topic}"] == 1
        first_round = len(set(wrong))
        assert seam.requests[DESCRIBE] == first_round + len({truth[p] for p in range(3)})
    finally:
        probe.close()


@pytest.mark.parametrize("status", [404, 405])
def test_a_node_without_the_request_is_asked_per_partition(
    cluster: Cluster, written: Setup, status: int
) -> None:
    expected = written.expected
    probe = SequencedPartitionWriter(cluster.url, written.writer.identity)
    seam = counted(probe, refuse=status)
    try:
        nodes = leader_nodes(probe, [tp for tp, _ in expected])
        assert probe.last_sequences(expected) == expected
        assert seam.requests[DESCRIBE] == len(nodes)  # each node's refusal, once
        assert seam.requests[GET_PRODUCERS] == len(expected)
        # remembered: the next call goes per partition at once
        assert probe.last_sequences(expected) == expected
        assert seam.requests[DESCRIBE] == len(nodes)
        assert seam.requests[GET_PRODUCERS] == 2 * len(expected)
    finally:
        probe.close()


def _schema() -> object:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("key", StringType()), StructField("value", StringType())])


def counted_sink(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, prefix: str, **options: str
) -> tuple[EosBatchWriter, Counted, set[str]]:
    """A batch sink to a new topic with ``options``, its transaction begun; the seam that
    counts every wire client's requests from now on; and the topic's leader nodes."""
    topic = cluster.create_topic(partitions=PARTITIONS, prefix=prefix)
    sink = EosBatchWriter(sink_options({"bootstrap": cluster.url, "topic": topic, **options},
                                       streaming=False), _schema())  # fmt: skip
    assert sink.identity is not None
    lookup = SequencedPartitionWriter(cluster.url, sink.identity)
    nodes = leader_nodes(lookup, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    lookup.close()
    seam = Counted()
    route_every_client(monkeypatch, seam)
    return sink, seam, nodes


def test_the_data_source_asks_once_per_node_and_refuses_a_missing_or_extra_batch(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, seam, nodes = counted_sink(cluster, monkeypatch, "lastseq-ds", batchRecords="3")
    options, identity, tid = sink.options, sink.identity, sink.transactional_id
    assert identity is not None
    # each task (slot) writes five records to every partition, in two batches of at most 3
    rows = [{"key": f"k{i}", "value": f"v{i}", "partition": i // 2 % PARTITIONS}
            for i in range(60)]  # fmt: skip
    tasks = [write_task(rows[slot::2], sink.spec, identity, slot=slot,
                        add_partitions=adder(options, tid, identity))
             for slot in (0, 1)]  # fmt: skip
    assert [len(t.records) for t in tasks] == [PARTITIONS, PARTITIONS]
    # each task asked where its slot got on all its partitions with one request per node
    assert seam.requests[DESCRIBE] == 2 * len(nodes)
    assert seam.requests[GET_PRODUCERS] == 0
    seam.requests.clear()

    check_written(options.connection, identity, tasks)  # 12 (partition, slot) pairs
    assert seam.requests[DESCRIBE] == len(nodes) and seam.requests[GET_PRODUCERS] == 0

    first = tasks[0]
    (name, p), count = sorted(first.records.items())[0]
    missing = Written(first.producer_id, first.producer_epoch, first.slot,
                      records={**first.records, (name, p): count + 1})  # fmt: skip
    with pytest.raises(RuntimeError, match=rf"{name}-{p} slot 0: {count + 1} records written, "
                       rf"the node has sequences up to {count - 1}; not committing"):  # fmt: skip
        check_written(options.connection, identity, [missing, tasks[1]])
    planter = SequencedPartitionWriter(cluster.url, identity)
    planter.produce(TopicPartition(name, p), count, [{"value": "second copy"}], slot=0)
    planter.close()
    with pytest.raises(RuntimeError, match=rf"{name}-{p} slot 0: {count} records written, "
                       rf"the node has sequences up to {count}; not committing"):  # fmt: skip
        check_written(options.connection, identity, tasks)
    sink.abort(list(tasks))


def test_an_unsorted_task_opens_its_last_batches_with_one_request_per_node(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sortWithinTask=false``: no partition fills a batch here, so every partition is
    first seen at the task's end, opened together (one request per node), and a retried
    attempt, which finds them all written, resends only duplicates."""
    sink, seam, nodes = counted_sink(cluster, monkeypatch, "lastseq-un", batchRecords="100",
                                     sortWithinTask="false")  # fmt: skip
    options, identity, tid = sink.options, sink.identity, sink.transactional_id
    assert identity is not None
    rows = [{"key": f"k{i}", "value": f"v{i}", "partition": i % PARTITIONS} for i in range(30)]
    attempts = [write_task(rows, sink.spec, identity, slot=4,
                           add_partitions=adder(options, tid, identity))
                for _ in range(2)]  # fmt: skip
    assert seam.requests[DESCRIBE] == 2 * len(nodes)
    assert seam.requests[GET_PRODUCERS] == 0
    assert attempts[1].duplicate_batches + attempts[1].skipped_batches == PARTITIONS
    check_written(options.connection, identity, attempts[:1])
    sink.abort(list(attempts))
