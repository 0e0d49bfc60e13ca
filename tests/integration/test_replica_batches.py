"""Followers copy many partitions from one leader node over one long poll (``fetch-many``,
``epoch-ends``: docs/design.md section 7), on three real storage-node processes with the
test playing the controller.

Shown here: every partition's records reach every follower; a follower holds one poll
per leader node, however many partitions it follows (counted from the requests it logs);
a partition the leader refuses is answered with its error beside the others' frames; a
request naming no partition is refused in the error envelope.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from eos_cli.launcher import ClusterPlan, LocalCluster
from tests.support.processes import wait_until

TOKEN = "replica-batches-internal-token-0123456789"
INTERNAL = {"authorization": f"Bearer {TOKEN}"}
TOPIC = "wide"
PARTITIONS = 40

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("replica-batches")
    plan = ClusterPlan(root / "cluster", nodes=3, coordinators=0, port_base=None,
                       token=TOKEN, log_level="info")  # fmt: skip
    cluster = LocalCluster(plan).start()
    try:
        for n in (1, 2, 3):
            for p in range(PARTITIONS):
                created = httpx.put(f"{cluster.node(n).url}/internal/v1/partitions/{TOPIC}/{p}",
                                    json={"replicas": [1, 2, 3]}, headers=INTERNAL)  # fmt: skip
                assert created.status_code == 200, created.text
        body = {"nodes": cluster.plan.node_urls, "leader": 1, "leader_epoch": 1,
                "partition_epoch": 1, "replicas": [1, 2, 3], "isr": [1, 2, 3],
                "min_insync_replicas": 2}  # fmt: skip
        for n in (1, 2, 3):
            for p in range(PARTITIONS):
                pushed = httpx.put(f"{cluster.node(n).url}/internal/v1/partitions/{TOPIC}/{p}"
                                   "/state", json=body, headers=INTERNAL)  # fmt: skip
                assert pushed.status_code == 200 and pushed.json()["applied"], pushed.text
        yield cluster
    finally:
        cluster.stop()


def log_ends(cluster: LocalCluster, n: int) -> dict[int, int]:
    listed = httpx.get(f"{cluster.node(n).url}/internal/v1/partitions", headers=INTERNAL).json()
    return {p["partition"]: p["log_end_offset"] for p in listed["partitions"]
            if p["topic"] == TOPIC}  # fmt: skip


def requests_logged(cluster: LocalCluster, n: int, path: str) -> int:
    """How many requests node ``n`` sent to ``path`` (httpx logs each at info level)."""
    text = cluster.node(n).log_path.read_text(errors="replace")
    return len(re.findall(rf"HTTP Request: POST \S+{re.escape(path)} ", text))


def test_every_partition_reaches_every_follower_over_one_poll_per_leader(
    nodes: LocalCluster,
) -> None:
    leader = nodes.node(1).url
    for p in range(PARTITIONS):
        answer = httpx.post(f"{leader}/v1/partitions/{TOPIC}/{p}/records", timeout=40,
                            json={"records": [{"value": f"v{p}-{i}"} for i in range(p + 1)]})
        assert answer.status_code == 200, answer.text  # acks=all: the ISR has it
    expected = {p: p + 1 for p in range(PARTITIONS)}
    for n in (2, 3):
        assert log_ends(nodes, n) == expected

    # Idle now: each follower keeps one long poll at its leader, not one per partition.
    before = {n: requests_logged(nodes, n, "/internal/v1/replicas/fetch-many") for n in (2, 3)}
    time.sleep(3)
    for n in (2, 3):
        polls = requests_logged(nodes, n, "/internal/v1/replicas/fetch-many") - before[n]
        assert polls <= 10, f"node {n} polled {polls} times in 3 s for {PARTITIONS} partitions"
        assert requests_logged(nodes, n, "/internal/v1/replicas/fetch") == 0


def test_a_refused_partition_is_answered_beside_the_others(nodes: LocalCluster) -> None:
    wait_until(lambda: log_ends(nodes, 2).get(0, 0) >= 1, timeout=20,
               what="node 2 to hold partition 0")  # fmt: skip
    body = {"replica_id": 2, "max_wait_ms": 5_000, "partitions": [
        {"topic": TOPIC, "partition": 0, "leader_epoch": 1, "fetch_offset": 0},
        {"topic": "absent", "partition": 0, "leader_epoch": 1, "fetch_offset": 0},
        {"topic": TOPIC, "partition": 1, "leader_epoch": 0, "fetch_offset": 0},
    ]}  # fmt: skip
    started = time.monotonic()
    answer = httpx.post(f"{nodes.node(1).url}/internal/v1/replicas/fetch-many", json=body,
                        headers=INTERNAL, timeout=30)  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - started < 4, "an answer with errors waits for nothing"
    line, _, frames = answer.content.partition(b"\n")
    entries = orjson.loads(line)["partitions"]
    assert [e.get("error") and e["error"]["code"] for e in entries] == [
        None, "UNKNOWN_TOPIC_OR_PARTITION", "FENCED_LEADER_EPOCH"
    ]
    assert entries[0]["bytes"] > 0 and len(frames) == entries[0]["bytes"]
    assert entries[0]["high_watermark"] == 1


def test_epoch_ends_answer_each_partition(nodes: LocalCluster) -> None:
    body = {"partitions": [
        {"topic": TOPIC, "partition": 3, "epoch": 1, "leader_epoch": 1},
        {"topic": TOPIC, "partition": 4, "epoch": 1, "leader_epoch": 2},
    ]}  # fmt: skip
    answer = httpx.post(f"{nodes.node(1).url}/internal/v1/replicas/epoch-ends", json=body,
                        headers=INTERNAL)  # fmt: skip
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["partitions"]
    assert (first["epoch"], first["end_offset"], first.get("error")) == (1, 4, None)
    assert second["error"]["code"] == "UNKNOWN_LEADER_EPOCH"


@pytest.mark.parametrize("path", ["fetch-many", "epoch-ends"])
def test_a_request_naming_no_partition_is_refused(nodes: LocalCluster, path: str) -> None:
    body: dict[str, object] = {"partitions": []}
    if path == "fetch-many":
        body["replica_id"] = 2
    answer = httpx.post(f"{nodes.node(1).url}/internal/v1/replicas/{path}", json=body,
                        headers=INTERNAL)  # fmt: skip
    assert answer.status_code == 422, answer.text  # schema validation, as everywhere
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    unauthenticated = httpx.post(f"{nodes.node(1).url}/internal/v1/replicas/{path}", json=body)
    assert unauthenticated.status_code == 401
