"""Markers against real storage nodes: a node down during a commit holds back only its own
partitions and gets its markers once it is back."""

from __future__ import annotations

import httpx
import pytest

from tests.coordinator.helpers import committed_values, leaders, produce, state_of, wait_state
from tests.support.cluster import ClusterFactory

pytestmark = pytest.mark.slow


def test_a_node_down_during_commit_gets_its_markers_when_it_returns(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        database="postgres", fsync=True, fast_loops=False,
        coordinator_flags=("--marker-backoff-max-ms", "300"),
    )
    c_url = cluster.url
    with httpx.Client(base_url=c_url, timeout=30) as c:
        c.post("/v1/topics", json={"name": "orders", "partitions": 2}).raise_for_status()
        placement = leaders(c_url, "orders")
        on = {node: p for p, node in placement.items()}
        ident: dict[str, dict[str, int]] = {}
        for tid, parts in (("both", [0, 1]), ("only2", [on[2]])):
            body = c.post(f"/v1/transactions/{tid}/init", json={}).json()
            ident[tid] = {"producer_id": body["producer_id"],
                          "producer_epoch": body["producer_epoch"]}
            c.post(f"/v1/transactions/{tid}/partitions", json={
                **ident[tid], "partitions": [{"topic": "orders", "partition": p} for p in parts],
            }).raise_for_status()
            for p in parts:
                produce(cluster.node(placement[p]).url, "orders", p,
                        ident[tid]["producer_id"], ident[tid]["producer_epoch"], 0,
                        [f"{tid}-{p}"])
        cluster.node(1).kill()
        answer = c.post("/v1/transactions/both/commit", json=ident["both"])
        assert answer.json()["state"] == "PrepareCommit"
        # The other transaction, all on node 2, completes at once.
        answer = c.post("/v1/transactions/only2/commit",
                        json={**ident["only2"], "wait_for_markers": True}, timeout=30)
        assert answer.json()["state"] == "CompleteCommit"
        # Node 2 took its marker of "both" too: its partition shows the committed data.
        n2 = cluster.node(2).url
        assert committed_values(n2, "orders", on[2]) == [f"both-{on[2]}", f"only2-{on[2]}"]
        assert state_of(c_url, "both") == "PrepareCommit"
        metrics = httpx.get(f"{c_url}/metrics", timeout=10).text
        assert "eos_coordinator_marker_queue_depth 1.0" in metrics
        # Node 1 returns (same data dir, same port) and gets its marker.
        cluster.start_node(1)
        wait_state(c_url, "both", "CompleteCommit", timeout=15)
        assert committed_values(cluster.node(1).url, "orders", on[1]) == [f"both-{on[1]}"]
