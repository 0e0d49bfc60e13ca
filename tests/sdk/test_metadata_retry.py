"""Kafka's retry semantics for a partition that is briefly missing on its node.

A topic created while its node is down is placed at once but created on the node only
when the coordinator's reconciler next runs after the node is back. Until then the node
answers UNKNOWN_TOPIC_OR_PARTITION. Kafka's clients treat that as stale metadata: refresh
and retry within the delivery timeout. So must the producers, the consumer and the admin
client, instead of failing the send or the transaction at once.

Real processes: one coordinator whose reconciler runs only every 3 s (so the window is
wide and sure to be hit) and two storage nodes; the node's own error counter shows that
the window was really hit.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from sdk import AdminClient, Consumer, Producer, TopicPartition, TransactionalProducer
from tests.sdk.helpers import uid
from tests.support.cluster import Cluster, ClusterFactory

RECONCILE_MS = 3_000


@pytest.fixture
def slow_reconciler_cluster(cluster_factory: ClusterFactory) -> Cluster:
    return cluster_factory(coordinator_flags=("--reconcile-interval-ms", str(RECONCILE_MS)))


def _unknown_answers(cluster: Cluster, node: int) -> float:
    text = httpx.get(f"{cluster.nodes[node - 1].url}/metrics", timeout=5).text
    found = re.search(r'eos_node_errors_total\{code="UNKNOWN_TOPIC_OR_PARTITION"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def _topic_missing_on_node_1(cluster: Cluster) -> str:
    """A topic whose partition 0 leads on node 1 and is not yet created there."""
    node = cluster.nodes[0]
    node.kill()
    while True:  # placement starts at a node picked from the name: find one that starts at 1
        name = uid("late")
        response = httpx.post(
            f"{cluster.url}/v1/topics", json={"name": name, "partitions": 1}, timeout=30
        )
        response.raise_for_status()
        if response.json()["partitions"][0]["leader"]["node_id"] == 1:
            break
    node.start()
    return name


@pytest.mark.slow
def test_producers_consumer_and_admin_retry_a_partition_not_yet_created(
    slow_reconciler_cluster: Cluster,
) -> None:
    """The window closes as soon as the controller pushes the partition to the restarted
    node; on a loaded machine that push may come before the clients' first request. The
    scenario is repeated, each time on a new topic, until the node's counter shows the
    window was hit; every attempt must deliver exactly the two records either way."""
    cluster = slow_reconciler_cluster
    for _attempt in range(4):
        before = _unknown_answers(cluster, 1)
        _late_partition_round_trip(cluster, _topic_missing_on_node_1(cluster))
        if _unknown_answers(cluster, 1) > before:
            return
    raise AssertionError("the node never said the partition is unknown in 4 tries")


def _late_partition_round_trip(cluster: Cluster, topic: str) -> None:
    """An idempotent and a transactional send to a partition its node may not have yet,
    read back read_committed by a consumer started first, and the partition's offsets."""
    tp = TopicPartition(topic, 0)
    results: dict[str, object] = {}

    def consume() -> None:
        with Consumer(cluster.url, isolation_level="read_committed") as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[str] = []
            for _ in range(200):
                got += [str(r.value) for r in consumer.poll(timeout=0.5)]
                if len(got) >= 2:
                    break
            results["consumed"] = got

    reader = threading.Thread(target=consume)
    reader.start()
    with Producer(cluster.url) as producer:
        first = producer.send(topic, "idempotent", partition=0).result(timeout=60)
    txn = TransactionalProducer(cluster.url, uid("late-tx"))
    try:
        txn.init_transactions()
        with txn.transaction():
            txn.send(topic, "transactional", partition=0)
    finally:
        txn.close()
    reader.join(timeout=120)
    with AdminClient(cluster.url) as admin:
        offsets = admin.list_offsets(tp)

    assert first.offset == 0
    assert results.get("consumed") == ["idempotent", "transactional"]
    assert offsets.last_stable_offset == offsets.high_watermark >= 2


@pytest.mark.slow
def test_admin_list_offsets_waits_for_the_partition(slow_reconciler_cluster: Cluster) -> None:
    """The window closes as soon as the controller pushes the partition to the restarted
    node, which may beat the admin's first call; the scenario is repeated until the node's
    counter shows the window was hit (it counts from the restart)."""
    cluster = slow_reconciler_cluster
    for _attempt in range(4):
        topic = _topic_missing_on_node_1(cluster)
        with AdminClient(cluster.url) as admin:
            offsets = admin.list_offsets((topic, 0))
        assert offsets.high_watermark == 0
        if _unknown_answers(cluster, 1) > 0:
            return
    raise AssertionError("the node never said the partition is unknown in 4 tries")
