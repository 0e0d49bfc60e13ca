"""DescribeProducers of many partitions (``POST /v1/producers/describe``) on real
processes: what a replicated cluster and an authenticated one add to the single node's
tests (``tests/partition/test_describe_producers_http.py``).

* Two storage nodes, every partition on both: an entry for a partition the node only
  follows is answered ``NOT_LEADER_OR_FOLLOWER`` (retriable: the writer looks the leader
  up again) beside the entries it leads, though the per-partition GET answers a follower.
* Authentication on: an entry of a topic the caller may not describe is refused alone with
  the GET's own refusal, and a caller without a token is refused whole.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.split_topic import post, split_topic
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

DESCRIBE = "/v1/producers/describe"
TOPIC = "described"
PARTITIONS = 6


def produce(node: str, partition: int, ident: dict[str, int], count: int, slot: int) -> None:
    answer = post(node, f"/v1/partitions/{TOPIC}/{partition}/records", {
        **ident, "base_sequence": 0, "slot": slot,
        "records": [{"value": f"p{partition}-{i}"} for i in range(count)]})  # fmt: skip
    assert answer.status_code == 200, answer.text


def mine(entry: dict[str, Any], producer_id: int) -> int | None:
    found = [p["last_sequence"] for p in entry["producers"] if p["producer_id"] == producer_id]
    return found[0] if found else None


def test_a_partition_the_node_follows_is_refused_alone(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(nodes=2)
    split = split_topic(cluster, TOPIC, PARTITIONS)
    node, leaders, led, followed = split.node, split.leaders, split.led, split.followed
    assert led and followed, leaders
    body = post(cluster.coordinator.url, "/v1/producers", {}).json()
    ident = {"producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"]}
    for p in led:
        produce(node, p, ident, p + 1, slot=5)
    produce(leaders[followed[0]], followed[0], ident, 3, slot=5)

    asked = [{"topic": TOPIC, "partition": p, "slot": 5} for p in [followed[0], *led]]

    def described() -> list[dict[str, Any]]:
        answer = post(node, DESCRIBE, {"partitions": asked})
        assert answer.status_code == 200, answer.text
        return list(answer.json()["partitions"])

    # A follower that has not yet heard of its leader answers LEADER_NOT_AVAILABLE.
    wait_until(lambda: described()[0]["error"]["code"] != "LEADER_NOT_AVAILABLE", timeout=30,
               what="the follower to know its leader")  # fmt: skip
    not_led, *answered = described()
    assert not_led["producers"] == []
    assert not_led["error"] == {**not_led["error"], "code": "NOT_LEADER_OR_FOLLOWER",
                                "retriable": True}  # fmt: skip
    assert [(e["partition"], e["error"], mine(e, ident["producer_id"])) for e in answered] == [
        (p, None, p) for p in led
    ]
    # The same request to the leader answers that partition (its batch of three).
    elsewhere = post(leaders[followed[0]], DESCRIBE, {"partitions": asked[:1]}).json()
    assert mine(elsewhere["partitions"][0], ident["producer_id"]) == 2
    # The per-partition GET answers on any replica: it is the batch that asks the leader.
    on_follower = httpx.get(f"{node}/v1/partitions/{TOPIC}/{followed[0]}/producers", timeout=30)
    assert on_follower.status_code == 200, on_follower.text


def test_a_topic_the_caller_may_not_describe_is_refused_alone(
    cluster_factory: ClusterFactory,
) -> None:
    secure: Cluster = cluster_factory(nodes=1, auth=True)
    with secure.client("admin") as admin:
        for name in ("visible", "secret"):
            assert admin.post("/v1/topics", json={"name": name, "partitions": 2}
                              ).status_code == 201  # fmt: skip
        # write implies describe, as in Kafka: what a Spark writer's principal holds
        assert admin.post("/v1/acls", json={"acls": [{
            "principal": "User:writer", "resource_type": "topic", "resource_name": "visible",
            "pattern_type": "literal", "operation": "write", "permission": "allow"}]}
        ).status_code == 201  # fmt: skip
        node = admin.get("/v1/topics/visible").json()["partitions"][0]["leader"]["url"]
    body = {"partitions": [{"topic": t, "partition": p} for t in ("secret", "visible")
                           for p in (0, 1)]}  # fmt: skip
    with secure.client("writer", node) as writer:
        wait_until(lambda: writer.get("/v1/partitions/visible/0/producers").status_code == 200,
                   timeout=20, what="the node to know the writer's rights")  # fmt: skip
        answer = writer.post(DESCRIBE, json=body)
        assert answer.status_code == 200, answer.text
        entries = answer.json()["partitions"]
        single = writer.get("/v1/partitions/secret/0/producers")
    assert [e["error"] and e["error"]["code"] for e in entries] == [
        "TOPIC_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED", None, None]
    assert all(e["producers"] == [] for e in entries)
    # the same refusal as the per-partition GET's, for the same right
    assert single.status_code == 403
    assert single.json()["error"]["code"] == entries[0]["error"]["code"]
    with secure.client(None, node) as anonymous:
        refused = anonymous.post(DESCRIBE, json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
