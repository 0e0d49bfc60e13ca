"""Batches of many partitions sent together through the tasks' wire client
(``spark_jobs._produce_many.BatchesTogether``) against the Spark modules' real cluster (no
Spark needed): one request per leader node, each batch settled on its own, a lost request
resent with the same sequences (duplicates at most), and a node without the path written
one batch per request."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eos_protocol.errors import NotFoundError
from sdk import TopicPartition
from spark_jobs._produce_many import BatchesTogether, SequencedBatch
from spark_jobs._wire import SequencedPartitionWriter, TransactionSession
from spark_jobs.check import read_all
from tests.spark.helpers import uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster
PARTITIONS = 6
Transaction = tuple[str, TransactionSession, SequencedPartitionWriter]


class Recorded:
    """The writer's requests by path; ``fail`` injects errors at the transport seam."""

    def __init__(self, writer: SequencedPartitionWriter) -> None:
        self.paths: Counter[str] = Counter()
        self.fail: dict[str, list[BaseException]] = {}
        self._send = writer.http.send_once
        writer.http.send_once = self  # type: ignore[method-assign]

    def __call__(self, method: str, url: str, **kwargs: Any) -> Any:
        path = httpx.URL(url).path
        self.paths[path] += 1
        queued = self.fail.get(path)
        if queued:
            raise queued.pop(0)
        return self._send(method, url, **kwargs)


@pytest.fixture
def transaction(cluster: Cluster) -> Iterator[Transaction]:
    topic = cluster.create_topic(partitions=PARTITIONS, prefix="together")
    session = TransactionSession(cluster.url, uid("driver"))
    identity = session.init()
    session.add_partitions([TopicPartition(topic, p) for p in range(PARTITIONS)])
    writer = SequencedPartitionWriter(cluster.url, identity)
    try:
        yield topic, session, writer
    finally:
        writer.close()
        session.close()


def batches(topic: str, round_: int) -> list[SequencedBatch]:
    return [SequencedBatch(TopicPartition(topic, p), round_, [{"value": f"p{p}-r{round_}"}])
            for p in range(PARTITIONS)]  # fmt: skip


def test_one_request_per_node_and_lost_requests_resent(
    cluster: Cluster, transaction: Transaction
) -> None:
    topic, session, writer = transaction
    recorded = Recorded(writer)
    together = BatchesTogether(writer)
    led = Counter(writer.leader(TopicPartition(topic, p)) for p in range(PARTITIONS))
    first = together.send(batches(topic, 0))
    assert [type(o).__name__ for o in first] == ["ProduceResponse"] * PARTITIONS
    assert not any(o.duplicate for o in first if not isinstance(o, BaseException))
    # A node leading several of the partitions gets them in one request; a node leading
    # one, at its partition's path.
    singles = sum(n for path, n in recorded.paths.items() if path.endswith("/records"))
    assert recorded.paths["/v1/produce"] == sum(1 for n in led.values() if n > 1) > 0, led
    assert singles == sum(1 for n in led.values() if n == 1), recorded.paths
    # A request whose answer is lost: every batch of it is sent again with its sequence
    # and comes back a duplicate or written once, never twice.
    recorded.fail["/v1/produce"] = [httpx.ReadError("answer lost")]
    again = together.send(batches(topic, 0))
    assert all(not isinstance(o, BaseException) and o.duplicate for o in again), again
    assert not any(isinstance(o, BaseException) for o in together.send(batches(topic, 1)))
    session.commit()
    values = sorted(str(r.value) for r in read_all(cluster.url, topic))
    assert values == sorted(f"p{p}-r{r}" for p in range(PARTITIONS) for r in (0, 1))


def test_a_node_without_the_path_takes_one_batch_per_request(
    cluster: Cluster, transaction: Transaction
) -> None:
    topic, session, writer = transaction
    recorded = Recorded(writer)
    recorded.fail["/v1/produce"] = [NotFoundError("Not Found")] * 10
    outcomes = BatchesTogether(writer).send(batches(topic, 0))
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    singles = sum(n for path, n in recorded.paths.items() if path.endswith("/records"))
    assert singles == PARTITIONS
    session.commit()
    assert len(read_all(cluster.url, topic)) == PARTITIONS
