"""Ids that hold ``/`` or ``%`` (any text, as Kafka's): each travels as one percent-encoded
path segment and is routed as one (``eos_server.path_segments``), through the fast paths of
the transaction calls, FastAPI's routes and the storage nodes' group offsets alike."""

from __future__ import annotations

import pytest

from eos_protocol.states import TransactionState
from sdk import AdminClient, Consumer, TopicPartition, TransactionalProducer
from tests.sdk.cluster import Cluster
from tests.sdk.helpers import read_topic, uid


@pytest.mark.parametrize("shape", ["{}/orders", "{}/a/b/", "{}%2Forders", "{}%/100%"])
def test_a_transactional_id_with_a_slash_commits_and_is_described(
    cluster: Cluster, shape: str
) -> None:
    topic = cluster.create_topic(partitions=1)
    tid = shape.format(uid("etl"))
    with TransactionalProducer(cluster.url, tid) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, tid)
        producer.commit_transaction()
    assert [r.value for r in read_topic(cluster.url, topic, 1, expect=1)] == [tid]
    with AdminClient(cluster.url) as admin:
        described = admin.describe_transaction(tid)
    assert described.transactional_id == tid
    assert described.state in (TransactionState.COMPLETE_COMMIT, TransactionState.EMPTY)


def test_group_ids_with_a_slash_and_with_an_escape_are_two_groups(cluster: Cluster) -> None:
    """``team/a`` and ``team%2Fa`` (the text, not an escape) keep offsets of their own."""
    topic = cluster.create_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    base = uid("team")
    groups = {f"{base}/a": 3, f"{base}%2Fa": 7, f"{base}/a/": 11}
    for group, offset in groups.items():
        with Consumer(cluster.url, group) as consumer:
            consumer.assign([tp])
            consumer.commit({tp: offset})
    for group, offset in groups.items():
        with Consumer(cluster.url, group) as consumer:
            found = consumer.committed([tp])[tp]
        assert found is not None and found.offset == offset, group
