"""KIP-890 verification with real processes: a storage node asks a real coordinator before
a transactional batch opens a transaction on a partition."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.cluster import ClusterFactory

pytestmark = pytest.mark.slow
TOPIC = "verified"


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


def produce(node_url: str, partition: int, ident: dict[str, int], seq: int) -> httpx.Response:
    return post(
        node_url,
        f"/v1/partitions/{TOPIC}/{partition}/records",
        {**ident, "base_sequence": seq, "transactional": True, "records": [{"value": f"v{seq}"}]},
    )


def high_watermark(node_url: str, partition: int) -> int:
    body = httpx.get(f"{node_url}/v1/partitions/{TOPIC}/{partition}/offsets").json()
    return int(body["high_watermark"])


def test_node_verifies_transactional_batches_with_the_coordinator(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(database="postgres", fsync=True, fast_loops=False)
    node, coordinator = cluster.node(1), cluster.coordinator
    created = post(coordinator.url, "/v1/topics", {"name": TOPIC, "partitions": 2})
    assert created.status_code == 201, created.text
    leaders = {p["partition"]: p["leader"]["url"] for p in created.json()["partitions"]}
    on_node = next(p for p, url in leaders.items() if url == node.url)

    ident = post(coordinator.url, "/v1/transactions/copier/init", {}).json()
    ident = {"producer_id": ident["producer_id"], "producer_epoch": ident["producer_epoch"]}

    # 1. not added to the transaction: refused, nothing written
    refused = produce(node.url, on_node, ident, 0)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "TRANSACTION_ABORTABLE"
    assert high_watermark(node.url, on_node) == 0

    # 2. added: accepted, and later batches of the same transaction need no question
    added = post(
        coordinator.url,
        "/v1/transactions/copier/partitions",
        {**ident, "partitions": [{"topic": TOPIC, "partition": on_node}]},
    )
    assert added.status_code == 200, added.text
    assert produce(node.url, on_node, ident, 0).status_code == 200
    assert produce(node.url, on_node, ident, 1).status_code == 200

    # 3. a late batch after the transaction ended cannot open a new one
    ended = post(
        coordinator.url, "/v1/transactions/copier/commit", {**ident, "wait_for_markers": True}
    )
    assert ended.status_code == 200, ended.text
    late = produce(node.url, on_node, ident, 2)
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "TRANSACTION_ABORTABLE"
    offsets = httpx.get(f"{node.url}/v1/partitions/{TOPIC}/{on_node}/offsets").json()
    assert offsets["last_stable_offset"] == offsets["high_watermark"]

    # 4. a zombie of an older epoch is fenced
    newer = post(coordinator.url, "/v1/transactions/copier/init", {}).json()
    assert newer["producer_epoch"] > ident["producer_epoch"]
    zombie = produce(node.url, on_node, ident, 2)
    assert zombie.status_code == 409
    assert zombie.json()["error"]["code"] == "PRODUCER_FENCED"

    # 5. no coordinator to ask: a retriable refusal, never an unverified transaction
    newer_ident = {
        "producer_id": newer["producer_id"],
        "producer_epoch": newer["producer_epoch"],
    }
    post(
        coordinator.url,
        "/v1/transactions/copier/partitions",
        {**newer_ident, "partitions": [{"topic": TOPIC, "partition": on_node}]},
    )
    coordinator.stop()
    unavailable = produce(node.url, on_node, newer_ident, 0)
    assert unavailable.status_code == 503
    body = unavailable.json()["error"]
    assert body["code"] == "COORDINATOR_NOT_AVAILABLE" and body["retriable"] is True
    assert high_watermark(node.url, on_node) == offsets["high_watermark"]
