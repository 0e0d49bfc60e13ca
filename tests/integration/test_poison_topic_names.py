"""Regression: a topic named ``..`` once stopped every later partition from being created.

``POST /v1/topics {"name": ".."}`` used to answer 201. The coordinator built the node URL
by formatting, ``/internal/v1/partitions/../0`` collapsed into a 404, the reconciler took
that for "node away" and stopped at that row at every round — for good, since the row
was in the database — and every produce to a topic created later failed with
UNKNOWN_TOPIC_OR_PARTITION. These tests run a real coordinator process and real storage
node processes on loopback, on a throw-away PostgreSQL database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from sdk import Producer
from tests.support.cluster import ClusterFactory
from tests.support.envelope import envelope_problems
from tests.support.nodes import INTERNAL_TOKEN, NodeProcess
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

TOPICS = [f"later-{i:02d}" for i in range(20)]
PARTITIONS = 3


def topics_by_name(url: str) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{url}/v1/metadata", timeout=10)
    assert answer.status_code == 200, answer.text
    return {t["name"]: t for t in answer.json()["topics"]}


def settled(url: str) -> str:
    """Wait until the coordinator has created every placed partition on its node (at
    start it creates ``__consumer_offsets``, later than its ``/readyz`` on a busy machine);
    returns ``url``."""

    def created() -> bool:
        return all(
            p["created_on_node"] or p["creation_error"]
            for t in topics_by_name(url).values()
            for p in t["partitions"]
        )

    wait_until(created, timeout=60, what="every partition created on its node")
    return url


def create_and_produce_everywhere(url: str) -> None:
    """Create ``TOPICS``, produce one record to each partition with the SDK and read each
    back from the partition's leader."""
    leaders: dict[tuple[str, int], str] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name in TOPICS:
            answer = client.post("/v1/topics", json={"name": name, "partitions": PARTITIONS})
            assert answer.status_code == 201, answer.text
            for p in answer.json()["partitions"]:
                assert (p["created_on_node"], p["creation_error"]) == (True, None), p
                leaders[(name, p["partition"])] = p["leader"]["url"]
    with Producer(url, delivery_timeout_ms=30_000) as producer:
        futures = {
            tp: producer.send(tp[0], f"{tp[0]}/{tp[1]}", partition=tp[1]) for tp in leaders
        }
        producer.flush(timeout=60)
        for tp, future in futures.items():
            meta = future.result(timeout=1)
            assert (meta.topic, meta.partition, meta.offset) == (tp[0], tp[1], 0)
    for (name, partition), leader in leaders.items():
        answer = httpx.get(f"{leader}/v1/partitions/{name}/{partition}/records",
                           params={"offset": 0}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert [r["value"] for r in answer.json()["records"]] == [f"{name}/{partition}"]


def test_dot_topic_names_are_refused_and_every_later_topic_works(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(database="postgres", fsync=True, fast_loops=False)
    url = settled(cluster.url)
    before = topics_by_name(url)
    for name in (".", ".."):
        answer = httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": 3},
                            timeout=10)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "INVALID_REQUEST"
        assert envelope_problems(answer.status_code, answer.content) == []
    assert topics_by_name(url) == before
    create_and_produce_everywhere(url)


def test_a_dot_dot_row_already_in_the_database_holds_back_no_later_topic(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(database="postgres", fsync=True, fast_loops=False)
    url = settled(cluster.url)
    cluster.coordinator.stop()
    assert cluster.database_url is not None
    engine = sa.create_engine(cluster.database_url)
    with engine.begin() as conn:  # as a version that accepted the name wrote it
        conn.execute(sa.text("INSERT INTO topics (name, partitions, internal, created_ms) "
                             "VALUES ('..', 3, false, 0)"))
        for partition, node in enumerate((1, 2, 1)):
            conn.execute(sa.text(
                "INSERT INTO topic_partitions (topic, partition, node_id, created_on_node) "
                "VALUES ('..', :p, :n, false)"), {"p": partition, "n": node})
    engine.dispose()
    coordinator = cluster.start_coordinator(0)  # restarted with the row there

    create_and_produce_everywhere(url)
    poisoned = topics_by_name(url)[".."]
    assert httpx.get(f"{url}/v1/topics/%2E%2E", timeout=10).json() == poisoned
    for p in poisoned["partitions"]:
        assert p["created_on_node"] is False
        assert p["creation_error"].startswith("INVALID_REQUEST: '..'"), p
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert "eos_coordinator_partitions_refused 3.0" in metrics

    def reported() -> list[dict[str, Any]]:
        lines = coordinator.log_path.read_text(errors="replace").splitlines()
        entries = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in entries if e.get("topic") == ".." and e["level"] == "error"]

    wait_until(lambda: len(reported()) == 3, timeout=10, what="one error line each")
    assert {(e["partition"], e["node_id"]) for e in reported()} == {(0, 1), (1, 2), (2, 1)}
    for process in cluster.nodes:
        assert process.data_dir is not None
        assert not any(path.name.startswith(".") for path in process.data_dir.iterdir())


def test_a_storage_node_refuses_a_dot_topic_and_writes_nothing(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "node", node_id=1)
    node.start()
    try:
        headers = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
        for encoded in ("%2E%2E", "%2E", ".%2e"):
            answer = httpx.put(f"{node.url}/internal/v1/partitions/{encoded}/0",
                               headers=headers, timeout=10)
            assert answer.status_code == 400, (encoded, answer.text)
            assert answer.json()["error"]["code"] == "INVALID_REQUEST"
            assert envelope_problems(answer.status_code, answer.content) == []
        assert httpx.put(f"{node.url}/internal/v1/partitions/fine/0", headers=headers,
                         timeout=10).status_code == 200
        listed = httpx.get(f"{node.url}/internal/v1/partitions", headers=headers,
                           timeout=10).json()["partitions"]
        assert [(p["topic"], p["partition"]) for p in listed] == [("fine", 0)]
        assert sorted(p.name for p in node.data_dir.iterdir() if p.is_dir()) == ["fine-0"]
    finally:
        node.stop()
