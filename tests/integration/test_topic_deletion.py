"""Topic deletion through the coordinator, on real processes: the topic leaves the metadata
at once, every node removes its replicas, the name is free again only once every node has
confirmed (a node that is down keeps it blocked), the groups' committed offsets of the
topic go with it, a transaction over a deleted topic still completes, and bad requests
change nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eos_cli.main import app
from sdk import (
    AdminClient,
    Consumer,
    InvalidRequestError,
    Producer,
    TopicAlreadyExistsError,
    TopicPartition,
    TransactionalProducer,
    UnknownTopicOrPartitionError,
)
from spark_jobs.check import read_all
from tests.sdk.helpers import wait_for
from tests.support.cluster import Cluster, ClusterFactory

#: Long enough for a loaded machine to run a few deleter rounds (100 ms each here) and the
#: settle time (twice the node timeout) after a deletion.
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Cluster:
    """Three nodes, every topic on all three (replication factor 3)."""
    return module_cluster_factory(nodes=3, replication_factor=3)


def _replica_dirs(cluster: Cluster, topic: str) -> list[Path]:
    found = []
    for node in cluster.nodes:
        assert node.data_dir is not None
        found += [p for p in node.data_dir.iterdir() if p.name.startswith(f"{topic}-")]
    return found


def _create_when_free(admin: AdminClient, topic: str, partitions: int) -> float:
    """Create ``topic`` as soon as its deletion lets it; returns how long that took."""
    began = time.monotonic()

    def created() -> bool:
        try:
            admin.create_topic(topic, partitions)
        except TopicAlreadyExistsError as exc:
            assert "is being deleted" in str(exc), exc
            return False
        return True

    wait_for(created, DEADLINE_S, f"{topic} to be created again")
    return time.monotonic() - began


def test_a_deleted_topic_is_gone_and_its_name_comes_back_empty(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=3, prefix="del")
    with Producer(cluster.url) as producer:
        for i in range(30):
            producer.send(topic, f"old-{i}", key=f"k{i}")
        producer.flush()
    assert len(read_all(cluster.url, topic)) == 30
    assert len(_replica_dirs(cluster, topic)) == 9

    with AdminClient(cluster.url) as admin:
        deleted = admin.delete_topic(topic)
        assert deleted is not None
        assert (deleted.name, deleted.partitions) == (topic, 3)
        assert sorted(deleted.pending_nodes) == [1, 2, 3]
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topic(topic)
        assert topic not in {t.name for t in admin.describe_cluster().topics}
        wait_for(lambda: not _replica_dirs(cluster, topic), DEADLINE_S,
                 f"every node to remove the replicas of {topic}")  # fmt: skip
        _create_when_free(admin, topic, 2)
        info = admin.describe_topic(topic)
        assert len(info.partitions) == 2
        wait_for(lambda: all(p.created_on_node for p in admin.describe_topic(topic).partitions),
                 DEADLINE_S, "the new partitions on their nodes")  # fmt: skip
        for p in range(2):
            offsets = admin.list_offsets(TopicPartition(topic, p))
            assert (offsets.log_start_offset, offsets.high_watermark) == (0, 0)
    assert read_all(cluster.url, topic) == []
    with Producer(cluster.url) as producer:
        producer.send(topic, "new", key="k").result(timeout=30)
    assert [str(r.value) for r in read_all(cluster.url, topic)] == ["new"]


def test_a_deleted_topics_group_offsets_go_with_it(cluster: Cluster) -> None:
    """Kafka's group coordinator drops the offsets of deleted partitions: a group that read
    the old topic must not start the new one of the same name at the old offsets (which
    would skip the new topic's first records). Other topics' offsets stay."""
    topic = cluster.create_topic(partitions=2, prefix="del")
    kept = cluster.create_topic(partitions=1, prefix="keep")
    groups = [f"g{i}-{topic}" for i in range(3)]  # most likely in different offsets partitions
    doomed = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    for group in groups:
        with Consumer(cluster.url, group) as consumer:
            consumer.commit({doomed[0]: 5, doomed[1]: 7, TopicPartition(kept, 0): 3})
            assert consumer.committed(doomed)[doomed[1]] is not None
    with AdminClient(cluster.url) as admin:
        admin.delete_topic(topic)
        _create_when_free(admin, topic, 2)
    for group in groups:
        with Consumer(cluster.url, group) as consumer:
            committed = consumer.committed([*doomed, TopicPartition(kept, 0)])
        assert [committed[tp] for tp in doomed] == [None, None], (group, committed)
        kept_offset = committed[TopicPartition(kept, 0)]
        assert kept_offset is not None and kept_offset.offset == 3, (group, committed)


def test_a_transaction_over_a_deleted_topic_still_completes(cluster: Cluster) -> None:
    doomed = cluster.create_topic(partitions=2, prefix="del")
    kept = cluster.create_topic(partitions=2, prefix="keep")
    with TransactionalProducer(cluster.url, f"tx-{doomed}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(doomed, f"d{i}", key=f"k{i}")
            producer.send(kept, f"k{i}", key=f"k{i}")
        producer.flush()
        with AdminClient(cluster.url) as admin:
            admin.delete_topic(doomed)
        producer.commit_transaction()  # the markers of the deleted topic are dropped
    assert sorted(str(r.value) for r in read_all(cluster.url, kept)) == sorted(
        f"k{i}" for i in range(10)
    )


def test_a_node_that_is_down_keeps_the_name_until_it_confirms(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="del")
    node = cluster.node(3)
    node.kill()
    try:
        with AdminClient(cluster.url) as admin:
            admin.delete_topic(topic)
            wait_for(lambda: not [p for p in _replica_dirs(cluster, topic)
                                  if node.data_dir not in p.parents],
                     DEADLINE_S, "the live nodes to remove their replicas")  # fmt: skip

            def refusal() -> str:
                try:
                    admin.create_topic(topic, 1)
                except TopicAlreadyExistsError as exc:
                    return str(exc)
                raise AssertionError(f"{topic} was created again while node 3 was down")

            # the live nodes confirm once the settle time is over; node 3 cannot
            wait_for(lambda: "node(s) 3 have not" in refusal(), DEADLINE_S,
                     "the name to wait for node 3 alone")  # fmt: skip
            assert _replica_dirs(cluster, topic), "the stopped node still holds its replicas"
            cluster.start_node(3)
            wait_for(lambda: not _replica_dirs(cluster, topic), DEADLINE_S,
                     "the restarted node to remove its replicas")  # fmt: skip
            _create_when_free(admin, topic, 1)
    finally:
        if not node.alive():
            cluster.start_node(3)


def test_bad_deletions_change_nothing(cluster: Cluster) -> None:
    with AdminClient(cluster.url) as admin:
        before = sorted(t.name for t in admin.describe_cluster().topics)
        with pytest.raises(InvalidRequestError, match="internal topic"):
            admin.delete_topic("__consumer_offsets")
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topic("no-such-topic-del")
        assert admin.delete_topic("no-such-topic-del", missing_ok=True) is None
        assert sorted(t.name for t in admin.describe_cluster().topics) == before
    with cluster.client(None) as client:
        answer = client.delete("/v1/topics/no-such-topic-del")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_the_cli_deletes_a_topic(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="del")
    runner = CliRunner()
    result = runner.invoke(app, ["topics", "delete", topic, "--bootstrap", cluster.url])
    assert result.exit_code == 0, result.output
    assert f"deleted {topic} (1 partitions)" in result.output
    again = runner.invoke(app, ["topics", "delete", topic, "--bootstrap", cluster.url])
    assert again.exit_code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in again.output
    missing = runner.invoke(
        app, ["topics", "delete", topic, "--missing-ok", "--bootstrap", cluster.url]
    )
    assert missing.exit_code == 0 and "nothing to delete" in missing.output
