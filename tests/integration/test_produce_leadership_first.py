"""A storage node refuses a transactional batch for a partition it does not lead with
NOT_LEADER_OR_FOLLOWER before it asks a coordinator anything.

Found by the Jepsen-style run (``tests/jepsen``, fault ``leader-cut``): a leader cut off
from every coordinator stops leading after its session timeout, but it verified each
transactional batch with the coordinators first and answered COORDINATOR_NOT_AVAILABLE,
which producers retry at the same node; they stayed there until the cut healed, 8 s and
more without a commit, where a new leader had been elected within 2 s. Here the nodes'
coordinator is an address nobody listens on, as for a node cut off from all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eos_cli.launcher import ClusterPlan, LocalCluster

TOKEN = "leadership-first-internal-token-0123456789"
TOPIC = "orders"
INTERNAL = {"authorization": f"Bearer {TOKEN}"}
#: Nothing listens here: every verification the nodes try fails.
NO_COORDINATOR = "http://127.0.0.1:9"

pytestmark = pytest.mark.slow


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[LocalCluster]:
    plan = ClusterPlan(tmp_path / "cluster", nodes=2, coordinators=0, port_base=None,
                       token=TOKEN, verify_with={1: NO_COORDINATOR, 2: NO_COORDINATOR})  # fmt: skip
    cluster = LocalCluster(plan).start()
    try:
        state = {"nodes": plan.node_urls, "min_insync_replicas": 1, "leader": 1, "leader_epoch": 1,
                 "partition_epoch": 1, "replicas": [1, 2], "isr": [1, 2]}  # fmt: skip
        for n in (1, 2):
            url = f"{cluster.node(n).url}/internal/v1/partitions/{TOPIC}/0"
            created = httpx.put(url, json={"replicas": [1, 2]}, headers=INTERNAL)
            assert created.status_code == 200, created.text
            assigned = httpx.put(f"{url}/state", json=state, headers=INTERNAL)
            assert assigned.status_code == 200 and assigned.json()["applied"], assigned.text
        yield cluster
    finally:
        cluster.stop()


def _transactional(url: str) -> dict[str, Any]:
    body = {"records": [{"value": "v"}], "producer_id": 7, "producer_epoch": 0,
            "base_sequence": 0, "transactional": True}  # fmt: skip
    answer = httpx.post(f"{url}/v1/partitions/{TOPIC}/0/records", json=body, timeout=30)
    assert answer.status_code >= 400, answer.text
    error: dict[str, Any] = answer.json()["error"]
    return error


def test_a_follower_refuses_a_transactional_batch_as_not_the_leader(nodes: LocalCluster) -> None:
    error = _transactional(nodes.node(2).url)
    assert error["code"] == "NOT_LEADER_OR_FOLLOWER", error
    assert error["retriable"] is True


def test_the_leader_still_needs_its_coordinator_for_a_transactional_batch(
    nodes: LocalCluster,
) -> None:
    # the check that stays: the leader appends nothing it could not verify
    error = _transactional(nodes.node(1).url)
    assert error["code"] == "COORDINATOR_NOT_AVAILABLE", error
