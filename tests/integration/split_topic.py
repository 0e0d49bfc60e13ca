"""A replicated topic on two nodes, and which of its partitions node 1 leads: the tests of
the node's requests of many partitions (produce, DescribeProducers) send node 1 one request
naming both kinds, and check that a partition it only follows is refused alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.cluster import Cluster


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


@dataclass(frozen=True)
class SplitTopic:
    node: str  # node 1's URL
    leaders: dict[int, str]  # partition -> its leader's URL
    led: list[int]  # the partitions node 1 leads
    followed: list[int]  # the partitions node 1 only follows


def split_topic(cluster: Cluster, topic: str, partitions: int) -> SplitTopic:
    """``topic`` made with two replicas of each partition on ``cluster`` (two nodes)."""
    created = post(cluster.coordinator.url, "/v1/topics",
                   {"name": topic, "partitions": partitions, "replication_factor": 2})  # fmt: skip
    assert created.status_code == 201, created.text
    node = cluster.node(1).url
    leaders = {p["partition"]: p["leader"]["url"] for p in created.json()["partitions"]}
    led = sorted(p for p, url in leaders.items() if url == node)
    followed = sorted(p for p, url in leaders.items() if url != node)
    return SplitTopic(node, leaders, led, followed)
