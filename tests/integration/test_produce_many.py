"""The multi-partition produce (``POST /v1/produce``) on real processes: two storage nodes,
a coordinator, a replicated topic.

One request to a node carries a fine batch of several partitions, a batch of a fenced
producer, a batch for a partition that does not exist, one for a partition the node only
follows and a transactional batch its transaction never added: each is answered on its
own, the fine ones are written once (a repeat of the request comes back ``duplicate``
with the same offsets), and the refused ones change nothing. A malformed request is
refused as a whole and writes nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.split_topic import post, split_topic
from tests.support.cluster import Cluster, ClusterFactory

pytestmark = pytest.mark.slow
TOPIC = "many"
PARTITIONS = 8


def high_watermarks(node_url: str, partitions: list[int]) -> dict[int, int]:
    return {
        p: int(httpx.get(f"{node_url}/v1/partitions/{TOPIC}/{p}/offsets").json()["high_watermark"])
        for p in partitions
    }


def values(node_url: str, partition: int) -> list[str]:
    body = httpx.get(f"{node_url}/v1/partitions/{TOPIC}/{partition}/records").json()
    return [r["value"] for r in body["records"]]


def init(cluster: Cluster, tid: str) -> dict[str, int]:
    body = post(cluster.coordinator.url, f"/v1/transactions/{tid}/init", {}).json()
    return {"producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"]}


def batch(
    partition: int, ident: dict[str, int], seq: int, value: str, **extra: Any
) -> dict[str, Any]:
    return {"topic": TOPIC, "partition": partition, **ident, "base_sequence": seq,
            "records": [{"key": f"k{partition}", "value": value}], **extra}  # fmt: skip


def test_each_batch_is_answered_on_its_own(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(nodes=2)
    split = split_topic(cluster, TOPIC, PARTITIONS)
    node, led, followed = split.node, split.led, split.followed
    assert len(led) >= 4 and followed, split.leaders
    fine, fenced, unadded = led[:2], led[2], led[3]

    idem = post(cluster.coordinator.url, "/v1/producers", {}).json()
    idem = {"producer_id": idem["producer_id"], "producer_epoch": idem["producer_epoch"]}
    # A transactional id initialised twice: its first epoch is fenced once the node has
    # seen the second one write.
    old = init(cluster, "fenced-copier")
    new = init(cluster, "fenced-copier")
    added = post(cluster.coordinator.url, "/v1/transactions/fenced-copier/partitions",
                 {**new, "partitions": [{"topic": TOPIC, "partition": fenced}]})  # fmt: skip
    assert added.status_code == 200, added.text
    first = post(node, "/v1/produce", {"batches": [
        batch(fenced, new, 0, "new-epoch", transactional=True)]})  # fmt: skip
    assert first.status_code == 200 and first.json()["batches"][0]["error"] is None, first.text
    lonely = init(cluster, "never-added")
    before = high_watermarks(node, [*led, followed[0]])

    request = {"batches": [
        batch(fine[0], idem, 0, "a"),
        batch(fenced, old, 1, "zombie", transactional=True),
        batch(PARTITIONS + 3, idem, 0, "nowhere"),
        batch(followed[0], idem, 0, "not-here"),
        batch(unadded, lonely, 0, "unadded", transactional=True),
        batch(fine[1], idem, 0, "b"),
    ]}  # fmt: skip
    answer = post(node, "/v1/produce", request)
    assert answer.status_code == 200, answer.text
    entries = answer.json()["batches"]
    assert [(e["topic"], e["partition"]) for e in entries] == [
        (b["topic"], b["partition"]) for b in request["batches"]
    ]
    codes = [None if e["error"] is None else e["error"]["code"] for e in entries]
    assert codes == [None, "PRODUCER_FENCED", "UNKNOWN_TOPIC_OR_PARTITION",
                     "NOT_LEADER_OR_FOLLOWER", "TRANSACTION_ABORTABLE", None], entries  # fmt: skip
    for entry in (entries[0], entries[5]):
        assert entry["base_offset"] == entry["last_offset"] and entry["duplicate"] is False
    assert all(e["base_offset"] is None for e in entries[1:5])

    after = high_watermarks(node, [*led, followed[0]])
    changed = {p for p in after if after[p] != before[p]}
    assert changed == set(fine), (before, after)
    assert values(node, fine[0])[-1] == "a" and values(node, fine[1])[-1] == "b"
    assert "zombie" not in values(node, fenced)

    # The same request again (an answer lost, say): the fine batches are duplicates with
    # their first offsets, and still nothing else changes.
    again = post(node, "/v1/produce", request).json()["batches"]
    assert [again[0]["duplicate"], again[5]["duplicate"]] == [True, True]
    assert again[0]["base_offset"] == entries[0]["base_offset"]
    assert again[5]["base_offset"] == entries[5]["base_offset"]
    assert high_watermarks(node, [*led, followed[0]]) == after


def test_a_malformed_request_is_refused_whole(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(nodes=1)
    created = post(cluster.coordinator.url, "/v1/topics", {"name": TOPIC, "partitions": 2})
    assert created.status_code == 201, created.text
    node = cluster.node(1).url
    plain = {"topic": TOPIC, "partition": 0, "records": [{"value": "x"}]}
    refusals = {
        "twice": {"batches": [plain, {**plain, "partition": 0}]},
        "none": {"batches": []},
        "typo": {"batches": [{**plain, "partitoin": 1}]},
        "one bad field": {"batches": [{**plain, "partition": 1}, {**plain, "acks": 0}]},
    }
    for name, body in refusals.items():
        refused = post(node, "/v1/produce", body)
        assert refused.status_code in (400, 422), (name, refused.text)
        assert refused.json()["error"]["code"] == "INVALID_REQUEST", (name, refused.text)
    assert high_watermarks(node, [0, 1]) == {0: 0, 1: 0}

    # The per-partition rules hold inside a batch: a producer id without its epoch.
    half = post(node, "/v1/produce", {"batches": [{**plain, "producer_id": 5}]})
    assert half.status_code == 200
    assert half.json()["batches"][0]["error"]["code"] == "INVALID_REQUEST"
    assert high_watermarks(node, [0, 1]) == {0: 0, 1: 0}
