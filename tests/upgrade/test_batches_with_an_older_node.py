"""A coordinator of this release with one storage node of the previous release (the last
one with replication), as in the middle of a rolling upgrade that began with the
coordinators: the older node knows neither the batched partition creation (405) nor the
batched partition states (404), and is asked one partition at a time, while the nodes of
this release are asked in batches. Every partition ends up on every replica, each led.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import ClusterFactory
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import wait_until
from tests.support.releases import RELEASES, install
from tests.upgrade.test_rolling_upgrade import _run_with

pytestmark = pytest.mark.slow

PARTITIONS = 120


def test_an_older_node_is_asked_one_partition_at_a_time(cluster_factory: ClusterFactory) -> None:
    previous = install([r for r in RELEASES if r.replication][-1])
    cluster = cluster_factory(nodes=3, replication_factor=3, start=False, log_level="info")
    _run_with(cluster.node(3), previous.python)
    cluster.start()
    answer = httpx.post(f"{cluster.url}/v1/topics", timeout=120, json={
        "name": "mixed", "partitions": PARTITIONS, "replication_factor": 3})  # fmt: skip
    assert answer.status_code == 201, answer.text

    def every_partition_made_and_led() -> bool:
        # on a loaded machine the older node's one-at-a-time answers may outlast the
        # creation's answer: the reconciler creates the rest in its next rounds
        made = httpx.get(f"{cluster.url}/v1/topics/mixed", timeout=30).json()["partitions"]
        return len(made) == PARTITIONS and all(
            p["created_on_node"] and p["leader"]["node_id"] != -1 for p in made
        )

    wait_until(every_partition_made_and_led, timeout=120,
               what="every partition created on its replicas and led")  # fmt: skip
    for n in (1, 2, 3):
        listed = httpx.get(f"{cluster.node(n).url}/internal/v1/partitions", timeout=30,
                           headers={"authorization": f"Bearer {INTERNAL_TOKEN}"})  # fmt: skip
        held = {p["partition"] for p in listed.json()["partitions"] if p["topic"] == "mixed"}
        assert held == set(range(PARTITIONS)), f"node {n}"
    log = "\n".join(path.read_text() for path in cluster.root.glob("logs/coordinator-*.log"))
    assert "node 3 takes no batched partition creation (HTTP 405)" in log
    assert "node 3 takes no batched partition states (HTTP 404)" in log
    for n in (1, 2):
        assert f"node {n} takes no batched" not in log
