"""Failover with real processes: two coordinators on one PostgreSQL, real storage nodes,
real SIGKILL and SIGSTOP."""

from __future__ import annotations

import threading

import httpx
import pytest
import sqlalchemy as sa

from tests.coordinator.helpers import committed_values, leaders, produce, state_of, wait_state
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.leases import tid_owned_by, wait_balanced
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 3000


def two_coordinators(cluster_factory: ClusterFactory, *flags: str) -> Cluster:
    """Real nodes (fsync on) verifying with the second coordinator; the leases shared
    evenly between the two before the test begins."""
    cluster = cluster_factory(
        database="postgres", coordinators=2, entry=1, fsync=True, fast_loops=False,
        lease_ms=LEASE_MS, coordinator_flags=flags,
    )
    wait_balanced(cluster.coordinators)
    return cluster


def _owner(url: str, tid: str) -> str:
    return str(httpx.get(f"{url}/v1/coordinators", params={"key": tid}, timeout=10
                         ).json().get("url"))


def test_survivor_completes_a_commit_whose_owner_was_killed_before_its_markers(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = two_coordinators(cluster_factory)
    a, b = cluster.coordinators
    tid = tid_owned_by(a, "killed-owner")
    with httpx.Client(base_url=a.url, timeout=30) as ca:
        assert _owner(b.url, tid) == a.url
        ca.post("/v1/topics", json={"name": "orders", "partitions": 2}).raise_for_status()
        placement = leaders(a.url, "orders")
        assert set(placement.values()) == {1, 2}
        init = ca.post(f"/v1/transactions/{tid}/init", json={}).json()
        pid, epoch = init["producer_id"], init["producer_epoch"]
        ident = {"producer_id": pid, "producer_epoch": epoch}
        ca.post(f"/v1/transactions/{tid}/partitions", json={
            **ident, "partitions": [{"topic": "orders", "partition": p} for p in (0, 1)],
        }).raise_for_status()
        for p, node in placement.items():
            produce(cluster.node(node).url, "orders", p, pid, epoch, 0, [f"v{p}"])
        # Hold the markers back: both nodes stop answering, A decides to commit...
        for node in cluster.nodes:
            node.pause()
        try:
            answer = ca.post(f"/v1/transactions/{tid}/commit", json=ident)
            assert answer.status_code == 200 and answer.json()["state"] == "PrepareCommit"
            # ... and dies before any marker got through.
            a.kill()
        finally:
            for node in cluster.nodes:
                node.resume()
    assert state_of(b.url, tid) == "PrepareCommit"
    # how long the takeover takes is measured by eos bench (failover part); here it only
    # has to happen, within a deadline a machine loaded by the whole suite still meets
    wait_state(b.url, tid, "CompleteCommit", timeout=LEASE_MS / 1000 + 30)
    assert _owner(b.url, tid) == b.url
    for p, node in placement.items():
        assert committed_values(cluster.node(node).url, "orders", p) == [f"v{p}"]
    description = httpx.get(f"{b.url}/v1/transactions/{tid}", timeout=10).json()
    assert description["coordinator_epoch"] == 2


def _snapshot(url: str) -> list[dict[str, object]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT * FROM transactions ORDER BY 1")).all()
            return [dict(r._mapping) for r in rows]
    finally:
        engine.dispose()


def test_a_paused_ex_owner_cannot_change_any_row_after_it_lost_its_lease(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = two_coordinators(cluster_factory, "--expiry-scan-interval-ms", "200")
    a, b = cluster.coordinators
    p1, p2, p3 = (tid_owned_by(a, name) for name in ("p1", "p2", "p3"))
    with httpx.Client(base_url=a.url, timeout=30) as ca:
        ca.post("/v1/topics", json={"name": "orders", "partitions": 2}).raise_for_status()
        ids: dict[str, tuple[int, int]] = {}
        for tid in (p1, p2, p3):
            body = ca.post(f"/v1/transactions/{tid}/init",
                           json={"transaction_timeout_ms": 1000}).json()
            ids[tid] = (body["producer_id"], body["producer_epoch"])
            ca.post(f"/v1/transactions/{tid}/partitions", json={
                "producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"],
                "partitions": [{"topic": "orders", "partition": 0}],
            }).raise_for_status()
    a.pause()
    try:
        wait_until(lambda: _owner(b.url, p1) == b.url, timeout=LEASE_MS / 1000 + 10,
                   what="B to take over")
        # B now owns everything; its scan aborts the timed-out transactions it inherited.
        for tid in ids:
            wait_state(b.url, tid, "CompleteAbort", timeout=10)
        assert cluster.database_url is not None
        before = _snapshot(cluster.database_url)
        # Requests queued at the paused A, answered with A's stale view once it resumes.
        answers: list[httpx.Response] = []

        def late_commit(tid: str) -> None:
            pid, epoch = ids[tid]
            answers.append(httpx.post(f"{a.url}/v1/transactions/{tid}/commit",
                                      json={"producer_id": pid, "producer_epoch": epoch},
                                      timeout=30))

        threads = [threading.Thread(target=late_commit, args=(t,)) for t in ids]
        for t in threads:
            t.start()
    finally:
        a.resume()
    for t in threads:
        t.join(timeout=30)
    assert len(answers) == 3
    assert all(r.status_code != 200 for r in answers), [r.text for r in answers]
    # Let A's own loops run a while (renewal, expiry scan): still nothing may change.
    wait_until(lambda: _owner(a.url, p1) == b.url, timeout=5, what="A to see B")
    assert _snapshot(cluster.database_url) == before
    # and B keeps serving
    with httpx.Client(base_url=b.url, timeout=30) as cb:
        body = cb.post(f"/v1/transactions/{p1}/init", json={}).json()
        assert body["producer_epoch"] > ids[p1][1]
