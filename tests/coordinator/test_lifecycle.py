"""The transactional lifecycle over HTTP against one coordinator on PostgreSQL, with fake
storage nodes standing in for the markers' recipients."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.coordinators import FakeNodes, InProcessCoordinator
from tests.support.processes import wait_until


def _ok(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def _code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def _init(client: httpx.Client, tid: str, **body: Any) -> tuple[int, int]:
    answer = _ok(client.post(f"/v1/transactions/{tid}/init", json=body))
    return answer["producer_id"], answer["producer_epoch"]


def _topic(client: httpx.Client, name: str = "orders", partitions: int = 4) -> None:
    _ok(client.post("/v1/topics", json={"name": name, "partitions": partitions}))


def _add(client: httpx.Client, tid: str, pid: int, epoch: int, *parts: int,
         topic: str = "orders") -> httpx.Response:
    return client.post(
        f"/v1/transactions/{tid}/partitions",
        json={"producer_id": pid, "producer_epoch": epoch,
              "partitions": [{"topic": topic, "partition": p} for p in parts]},
    )


def _end(client: httpx.Client, tid: str, pid: int, epoch: int, action: str = "commit",
         wait: bool = True) -> httpx.Response:
    return client.post(
        f"/v1/transactions/{tid}/{action}",
        json={"producer_id": pid, "producer_epoch": epoch, "wait_for_markers": wait},
    )


def _describe(client: httpx.Client, tid: str) -> dict[str, Any]:
    return dict(_ok(client.get(f"/v1/transactions/{tid}")))


def test_commit_writes_markers_to_every_partition_then_completes(
    coordinator: InProcessCoordinator, fake_nodes: FakeNodes
) -> None:
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "t1")
        assert epoch == 0
        answer = _ok(_add(c, "t1", pid, epoch, 0, 1, 2, 3))
        assert [p["error"] for p in answer["partitions"]] == [None] * 4
        _ok(c.post("/v1/transactions/t1/offsets",
                   json={"producer_id": pid, "producer_epoch": epoch, "group_id": "g"}))
        desc = _describe(c, "t1")
        assert desc["state"] == "Ongoing"
        assert desc["groups"] == ["g"]
        assert len(desc["partitions"]) == 5  # four data partitions and the group's offsets
        assert _ok(_end(c, "t1", pid, epoch))["state"] == "CompleteCommit"
        marked = {
            (tp["topic"], tp["partition"])
            for _n, m in fake_nodes.markers_for(pid)
            for tp in m["partitions"]
            if m["result"] == "COMMIT"
        }
        assert marked == {(p["topic"], p["partition"]) for p in desc["partitions"]}
        # A retried commit (same epoch, same decision) succeeds without a second effect.
        before = len(fake_nodes.markers_for(pid))
        assert _ok(_end(c, "t1", pid, epoch))["state"] == "CompleteCommit"
        assert len(fake_nodes.markers_for(pid)) == before
        # ... while the other decision is not legal any more.
        assert _code(_end(c, "t1", pid, epoch, "abort")) == "INVALID_TXN_STATE"
        # The next transaction starts from CompleteCommit.
        _ok(_add(c, "t1", pid, epoch, 0))
        assert _ok(_end(c, "t1", pid, epoch, "abort"))["state"] == "CompleteAbort"


def test_commit_without_wait_answers_prepare_and_completes_later(
    coordinator: InProcessCoordinator, fake_nodes: FakeNodes
) -> None:
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "t2")
        _ok(_add(c, "t2", pid, epoch, 0))
        fake_nodes.down.add(1)
        fake_nodes.down.add(2)
        assert _ok(_end(c, "t2", pid, epoch, wait=False))["state"] == "PrepareCommit"
        # While the markers are pending: adds and init are CONCURRENT_TRANSACTIONS.
        response = _add(c, "t2", pid, epoch, 1)
        assert response.status_code == 503 and _code(response) == "CONCURRENT_TRANSACTIONS"
        assert response.json()["error"]["retriable"] is True
        metrics = c.get("/metrics").text
        assert "eos_coordinator_marker_queue_depth 1.0" in metrics
        fake_nodes.down.clear()
        wait_until(lambda: _describe(c, "t2")["state"] == "CompleteCommit",
                   timeout=10, what="CompleteCommit")


def test_producer_checks_and_state_errors(coordinator: InProcessCoordinator) -> None:
    with coordinator.client() as c:
        _topic(c)
        response = c.post("/v1/transactions/x/init", json={"transaction_timeout_ms": 900_001})
        assert response.status_code == 400 and _code(response) == "INVALID_TRANSACTION_TIMEOUT"
        pid, epoch = _init(c, "x")
        assert _code(_end(c, "x", pid, epoch)) == "INVALID_TXN_STATE"  # Empty: nothing added
        assert _code(_add(c, "x", pid + 12345, epoch, 0)) == "INVALID_PRODUCER_ID_MAPPING"
        assert _code(_add(c, "nobody", pid, epoch, 0)) == "INVALID_PRODUCER_ID_MAPPING"
        pid2, epoch2 = _init(c, "x")  # a second producer fences the first
        assert (pid2, epoch2) == (pid, epoch + 1)
        response = _add(c, "x", pid, epoch, 0)
        assert response.status_code == 409 and _code(response) == "PRODUCER_FENCED"
        assert _code(_add(c, "x", pid, epoch2 + 1, 0)) == "INVALID_PRODUCER_EPOCH"
        answer = _ok(_add(c, "x", pid2, epoch2, 0, 99))
        assert [p["error"] for p in answer["partitions"]] == [None, "UNKNOWN_TOPIC_OR_PARTITION"]
        response = _add(c, "x", pid2, epoch2, 0, topic="missing")
        assert _ok(response)["partitions"][0]["error"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_init_fences_an_ongoing_transaction_by_aborting_it(
    coordinator: InProcessCoordinator, fake_nodes: FakeNodes
) -> None:
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "z")
        _ok(_add(c, "z", pid, epoch, 0, 1))
        pid2, epoch2 = _init(c, "z")
        assert pid2 == pid and epoch2 == epoch + 2  # +1 for the fence, +1 for the new producer
        aborts = [m for _n, m in fake_nodes.markers_for(pid) if m["result"] == "ABORT"]
        assert aborts and all(m["producer_epoch"] == epoch + 1 for m in aborts)
        assert _describe(c, "z")["state"] == "CompleteAbort"
        assert _code(_end(c, "z", pid, epoch)) == "PRODUCER_FENCED"


def test_init_while_markers_are_stuck_is_concurrent_transactions(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    coordinator = coordinator_factory(init_wait_ms=200)
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "s")
        _ok(_add(c, "s", pid, epoch, 0, 1, 2, 3))
        fake_nodes.down.update({1, 2})
        _ok(_end(c, "s", pid, epoch, wait=False))
        response = c.post("/v1/transactions/s/init", json={})
        assert _code(response) == "CONCURRENT_TRANSACTIONS"
        fake_nodes.down.clear()
        wait_until(lambda: c.post("/v1/transactions/s/init", json={}).status_code == 200,
                   timeout=10, what="init after the markers")
        assert _describe(c, "s")["state"] == "CompleteCommit"


def test_kip360_recovery_and_retried_init(coordinator: InProcessCoordinator) -> None:
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "k")
        _ok(_add(c, "k", pid, epoch, 0))
        # The producer hit a fatal idempotence error: it re-inits with its own id and epoch.
        pid2, epoch2 = _init(c, "k", producer_id=pid, producer_epoch=epoch)
        assert pid2 == pid and epoch2 > epoch
        assert _describe(c, "k")["state"] == "CompleteAbort"
        # A retry of that init (its answer was lost) gets the same answer, no second bump.
        response = c.post("/v1/transactions/k/init",
                          json={"producer_id": pid, "producer_epoch": epoch2 - 1})
        assert _ok(response) == {"producer_id": pid2, "producer_epoch": epoch2}
        # A stale epoch is fenced; a foreign producer id is refused.
        assert _code(c.post("/v1/transactions/k/init",
                            json={"producer_id": pid, "producer_epoch": 0})) == "PRODUCER_FENCED"
        assert _code(c.post("/v1/transactions/k/init",
                            json={"producer_id": pid + 77, "producer_epoch": 0})
                     ) == "INVALID_PRODUCER_ID_MAPPING"


def test_epoch_exhaustion_rolls_over_to_a_new_producer_id(
    coordinator_factory: Any, pg_url: str
) -> None:
    import sqlalchemy as sa

    first = coordinator_factory()
    with first.client() as c:
        pid, _ = _init(c, "r")
    first.stop()
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE transactions SET producer_epoch = 32766"))
    engine.dispose()
    second = coordinator_factory()
    with second.client() as c:
        pid2, epoch2 = _init(c, "r")
        assert pid2 != pid and epoch2 == 0
        # A retry of the rollover init (its answer was lost) gets the same new id.
        again = _ok(c.post("/v1/transactions/r/init",
                           json={"producer_id": pid, "producer_epoch": 32766}))
        assert again == {"producer_id": pid2, "producer_epoch": 0}
        _topic(c)
        assert _code(_add(c, "r", pid, 32766, 0)) == "PRODUCER_FENCED"
        _ok(_add(c, "r", pid2, 0, 0))


def test_admin_list_describe_and_force_abort(
    coordinator: InProcessCoordinator, fake_nodes: FakeNodes
) -> None:
    with coordinator.client() as c:
        _topic(c)
        pid, epoch = _init(c, "hang")
        _ok(_add(c, "hang", pid, epoch, 2))
        _init(c, "idle")
        listed = _ok(c.get("/v1/transactions", params={"state": "Ongoing"}))["transactions"]
        assert [t["transactional_id"] for t in listed] == ["hang"]
        assert listed[0]["duration_ms"] >= 0
        everyone = _ok(c.get("/v1/transactions"))["transactions"]
        assert {t["transactional_id"] for t in everyone} == {"hang", "idle"}
        slow = _ok(c.get("/v1/transactions", params={"min_duration_ms": 3_600_000}))
        assert slow["transactions"] == []
        assert _code(c.get("/v1/transactions/none")) == "TRANSACTIONAL_ID_NOT_FOUND"
        answer = _ok(c.post("/v1/admin/transactions/hang/abort", json={}))
        assert answer["state"] == "PrepareAbort"
        wait_until(lambda: _describe(c, "hang")["state"] == "CompleteAbort", timeout=10,
                   what="force abort to complete")
        assert _describe(c, "hang")["producer_epoch"] == epoch + 1
        assert _code(_end(c, "hang", pid, epoch)) == "PRODUCER_FENCED"
