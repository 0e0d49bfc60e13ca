"""Group administration over HTTP on a real cluster: lag against the last stable offset,
and resetting an empty group's offsets to earliest, latest, a time or an offset.

The coordinator asks the storage nodes for the committed offsets and each partition's
bounds; a reset is refused while the group has a member, and otherwise lands in the
group's committed offsets, where a consumer starts from it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sdk import Consumer, Producer, TopicPartition
from tests.support.cluster import Cluster, ClusterFactory

pytestmark = pytest.mark.slow

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Iterator[Cluster]:
    yield module_cluster_factory()


def _ok(answer: httpx.Response) -> Any:
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def _produce(cluster: Cluster, topic: str, per_partition: int, tag: str) -> None:
    with Producer(cluster.url) as producer:
        for p in range(PARTITIONS):
            for i in range(per_partition):
                producer.send(topic, f"{tag}-{i}", partition=p)
        producer.flush()


def _committed(cluster: Cluster, group: str, topic: str) -> dict[int, int | None]:
    with Consumer(cluster.url, group_id=group) as consumer:
        found = consumer.committed([(topic, p) for p in range(PARTITIONS)])
    return {tp.partition: (o.offset if o else None) for tp, o in found.items()
            if tp.topic == topic}


def test_lag_and_resets_of_an_empty_group(cluster: Cluster) -> None:
    topic, group = f"admin-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=cluster.url, timeout=60) as c:
        _ok(c.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS}))
        _produce(cluster, topic, 5, "early")
        middle = int(time.time() * 1000) + 1
        while int(time.time() * 1000) <= middle:
            time.sleep(0.002)
        _produce(cluster, topic, 5, "late")
        with Consumer(cluster.url, group_id=group) as consumer:
            consumer.commit({TopicPartition(topic, p): 2 for p in range(PARTITIONS)})
        member = _ok(c.post(f"/v1/groups/{group}/heartbeat", json={
            "member_epoch": 0, "subscribed_topic_names": [topic], "owned_partitions": []}))
        described = _ok(c.get(f"/v1/groups/{group}"))
        lag = {row["partition"]: row for row in described["lag"] if row["topic"] == topic}
        assert sorted(lag) == list(range(PARTITIONS)), described
        for row in lag.values():
            assert (row["committed_offset"], row["last_stable_offset"], row["lag"]) == (2, 10, 8)
            assert row["owner"] == member["member_id"]
        busy = c.post(f"/v1/groups/{group}/offsets/reset",
                      json={"topics": [topic], "to_earliest": True})
        assert busy.json()["error"]["code"] == "NON_EMPTY_GROUP"
        assert _committed(cluster, group, topic) == dict.fromkeys(range(PARTITIONS), 2)
        _ok(c.post(f"/v1/groups/{group}/heartbeat",
                   json={"member_id": member["member_id"], "member_epoch": -1}))
        for body, expected in (
            ({"to_earliest": True}, 0),
            ({"to_latest": True}, 10),
            ({"to_offset": 3}, 3),
            ({"to_offset": 99}, 10),  # clamped to what the partition holds
            ({"to_timestamp_ms": middle}, 5),
        ):
            answer = _ok(c.post(f"/v1/groups/{group}/offsets/reset",
                                json={"topics": [topic], **body}))
            assert {o["offset"] for o in answer["offsets"]} == {expected}, body
            assert _committed(cluster, group, topic) == dict.fromkeys(
                range(PARTITIONS), expected
            ), body
        with Consumer(cluster.url, group_id=group) as consumer:
            consumer.assign([(topic, 0)])
            first = consumer.poll(timeout=10)
        assert first and first[0].value == "late-0"
        two = c.post(f"/v1/groups/{group}/offsets/reset",
                     json={"topics": [topic], "to_earliest": True, "to_latest": True})
        assert two.json()["error"]["code"] == "INVALID_REQUEST"
        missing = c.post(f"/v1/groups/{group}/offsets/reset",
                         json={"topics": ["no-such-topic"], "to_earliest": True})
        assert missing.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
        _ok(c.delete(f"/v1/groups/{group}"))
        assert c.get(f"/v1/groups/{group}").json()["error"]["code"] == "GROUP_ID_NOT_FOUND"
