"""Metadata, topics, FindCoordinator, producer ids, the internal producer view, health."""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path
from typing import Any

from tests.coordinator.helpers import add, code, end, init, ok, topic
from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes
from tests.support.processes import wait_until


def test_topics_are_placed_round_robin_and_created_on_their_nodes(
    coordinator: Any, fake_nodes: FakeNodes
) -> None:
    with coordinator.client() as c:
        created = topic(c, "events", 6)
        leaders = [p["leader"]["node_id"] for p in created["partitions"]]
        assert sorted(leaders) == [1, 1, 1, 2, 2, 2]
        assert all(a != b for a, b in itertools.pairwise(leaders))
        assert {(n, t, p) for n, t, p in fake_nodes.created if t == "events"} == {
            (leader, "events", i) for i, leader in enumerate(leaders)
        }
        assert code(c.post("/v1/topics", json={"name": "events", "partitions": 1})
                    ) == "TOPIC_ALREADY_EXISTS"
        assert ok(c.get("/v1/topics/events")) == created
        assert code(c.get("/v1/topics/nope")) == "UNKNOWN_TOPIC_OR_PARTITION"
        assert c.post("/v1/topics", json={"name": "bad name", "partitions": 1}
                      ).status_code == 422
        md = ok(c.get("/v1/metadata"))
        assert md["cluster_id"]
        assert md["nodes"] == [{"node_id": 1, "url": fake_nodes.urls[1]},
                               {"node_id": 2, "url": fake_nodes.urls[2]}]
        names = [t["name"] for t in md["topics"]]
        assert names == ["__consumer_offsets", "events"]
        offsets = md["topics"][0]["partitions"]
        assert len(offsets) == 5
        # every __consumer_offsets partition was created on its node at first start
        wait_until(lambda: sum(1 for _n, t, _p in fake_nodes.created
                               if t == "__consumer_offsets") == 5, what="offsets partitions")


def test_partitions_of_a_node_that_was_down_are_created_when_it_returns(
    coordinator: Any, fake_nodes: FakeNodes
) -> None:
    fake_nodes.down.add(2)
    with coordinator.client() as c:
        topic(c, "later", 4)
    assert all(n == 1 for n, t, _p in fake_nodes.created if t == "later")
    fake_nodes.down.clear()
    wait_until(lambda: sum(1 for _n, t, _p in fake_nodes.created if t == "later") == 4,
               timeout=10, what="reconciler")


def test_find_coordinator(coordinator: Any, fake_nodes: FakeNodes) -> None:
    with coordinator.client() as c:
        answer = ok(c.get("/v1/coordinators", params={"key_type": "transaction", "key": "t"}))
        assert answer["url"] == coordinator.url
        assert answer["node_id"] == coordinator.services.node_id
        group = ok(c.get("/v1/coordinators", params={"key_type": "group", "key": "g1"}))
        partition = zlib.crc32(b"g1") % 5
        md = ok(c.get("/v1/metadata"))
        leader = md["topics"][0]["partitions"][partition]["leader"]
        assert (group["node_id"], group["url"]) == (leader["node_id"], leader["url"])
        assert group["key"] == "g1" and group["key_type"] == "group"


def test_producer_ids_are_unique_across_instances(coordinator_factory: Any) -> None:
    a = coordinator_factory(producer_id_block_size=10)
    b = coordinator_factory(producer_id_block_size=10)
    seen: list[int] = []
    with a.client() as ca, b.client() as cb:
        for _ in range(25):
            for c in (ca, cb):
                answer = ok(c.post("/v1/producers", json={}))
                assert answer["producer_epoch"] == 0
                seen.append(answer["producer_id"])
    assert len(set(seen)) == len(seen) == 50


def test_internal_producer_view(coordinator: Any) -> None:
    with coordinator.client() as c:
        topic(c)
        pid, epoch = init(c, "v")
        path = f"/internal/v1/producers/{pid}/transaction"
        assert code(c.get(path)) == "UNAUTHENTICATED"
        assert code(c.get(path, headers={"Authorization": "Bearer wrong"})) == "UNAUTHENTICATED"
        auth = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
        view = ok(c.get(path, headers=auth))
        assert view == {"producer_id": pid, "producer_epoch": epoch, "transactional_id": "v",
                        "state": "Empty", "partitions": [], "transaction_version": 1}
        ok(add(c, "v", pid, epoch, 1, 2))
        view = ok(c.get(path, headers=auth))
        assert view["state"] == "Ongoing"
        assert view["partitions"] == [{"topic": "orders", "partition": 1},
                                      {"topic": "orders", "partition": 2}]
        ok(end(c, "v", pid, epoch))
        assert ok(c.get(path, headers=auth))["state"] == "CompleteCommit"
        missing = c.get("/internal/v1/producers/999999/transaction", headers=auth)
        assert missing.status_code == 404 and code(missing) == "UNKNOWN_PRODUCER_ID"


def test_health_metrics_and_openapi(coordinator: Any) -> None:
    with coordinator.client() as c:
        assert ok(c.get("/healthz")) == {"status": "ok"}
        assert ok(c.get("/readyz")) == {"status": "ready"}
        # a partition taken later loads without making the serving instance unready
        leases = coordinator.services.leases
        leases.loading.add(49)
        try:
            assert ok(c.get("/readyz")) == {"status": "ready"}
        finally:
            leases.loading.discard(49)
        leases.ready = False  # before the first round has loaded its share
        try:
            assert c.get("/readyz").status_code == 503
        finally:
            leases.ready = True
        text = c.get("/metrics").text
        for name in ("eos_coordinator_open_transactions", "eos_coordinator_commits_total",
                     "eos_coordinator_commits_per_second", "eos_coordinator_aborts_per_second",
                     "eos_coordinator_marker_queue_depth",
                     "eos_coordinator_marker_queue_oldest_age_seconds",
                     "eos_coordinator_owned_log_partitions 50.0"):
            assert name in text
        spec = ok(c.get("/openapi.json"))
        for path in ("/v1/metadata", "/v1/topics", "/v1/coordinators", "/v1/producers",
                     "/v1/transactions/{tid}/init", "/v1/transactions/{tid}/partitions",
                     "/v1/transactions/{tid}/offsets", "/v1/transactions/{tid}/commit",
                     "/v1/transactions/{tid}/abort", "/v1/transactions",
                     "/v1/transactions/{tid}", "/v1/admin/transactions/{tid}/abort",
                     "/internal/v1/producers/{producer_id}/transaction"):
            assert path in spec["paths"], path
        assert "409" in spec["paths"]["/v1/transactions/{tid}/commit"]["post"]["responses"]
        assert code(c.get("/v1/nowhere")) == "NOT_FOUND"


def test_sqlite_default_runs_the_lifecycle(coordinator_factory: Any, tmp_path: Path) -> None:
    coordinator = coordinator_factory(database_url=None, data_dir=tmp_path / "coord")
    assert coordinator.services.db.dialect == "sqlite"
    assert (tmp_path / "coord" / "coordinator.db").exists()
    with coordinator.client() as c:
        topic(c)
        pid, epoch = init(c, "lite")
        ok(add(c, "lite", pid, epoch, 0, 1))
        assert ok(end(c, "lite", pid, epoch))["state"] == "CompleteCommit"
        pid2, epoch2 = init(c, "lite")
        assert (pid2, epoch2) == (pid, epoch + 1)
