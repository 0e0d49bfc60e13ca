"""A topic of a thousand partitions on three replicas, on real processes (one coordinator,
three storage nodes): the coordinator asks each node for its partitions in batches and
pushes their first states in one request per node, so the creation is answered with every
partition on every replica and led. One request per partition and replica, one after
another, took minutes here and ran past a client's timeout."""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import ClusterFactory
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 1000


def test_a_thousand_partitions_of_three_replicas_are_created_on_every_replica(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(nodes=3, replication_factor=3)
    answer = httpx.post(f"{cluster.url}/v1/topics", timeout=120,
                        json={"name": "wide", "partitions": PARTITIONS, "replication_factor": 3})
    assert answer.status_code == 201, answer.text
    made = answer.json()["partitions"]
    assert [p["partition"] for p in made] == list(range(PARTITIONS))
    assert all(p["created_on_node"] and p["creation_error"] is None for p in made)
    assert all(sorted(p["replicas"]) == [1, 2, 3] for p in made)

    for n in (1, 2, 3):
        listed = httpx.get(f"{cluster.node(n).url}/internal/v1/partitions", timeout=30,
                           headers={"authorization": f"Bearer {INTERNAL_TOKEN}"})  # fmt: skip
        assert listed.status_code == 200, listed.text
        held = {p["partition"] for p in listed.json()["partitions"] if p["topic"] == "wide"}
        assert held == set(range(PARTITIONS)), f"node {n} lacks {set(range(PARTITIONS)) - held}"

    # the leaders learnt their assignment: each takes a write (the leader asked afresh, as
    # a node slowed down by the creation may have lost the lead to another replica since)
    def takes_a_write(partition: int) -> bool:
        described = httpx.get(f"{cluster.url}/v1/topics/wide", timeout=30).json()
        leader = described["partitions"][partition]["leader"]["node_id"]
        if leader == -1:
            return False
        produced = httpx.post(f"{cluster.node(leader).url}/v1/partitions/wide/{partition}/records",
                              json={"records": [{"value": "v"}], "acks": 1}, timeout=30)
        return produced.status_code == 200

    for partition in (0, PARTITIONS // 2, PARTITIONS - 1):
        wait_until(lambda: takes_a_write(partition), timeout=30,  # noqa: B023
                   what=f"the leader of wide/{partition} to take a write")  # fmt: skip
