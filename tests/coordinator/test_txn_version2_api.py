"""Transaction version 2 at an in-process coordinator on PostgreSQL (migrated by Alembic),
with fake storage nodes: the opt-in at init, the nodes' add route
(``POST /internal/v1/producers/{id}/partitions``), the epoch bump of every end and its
markers, the retry of an end whose answer was lost, the rollover when the epoch runs out,
a restart, and the node's pool following NOT_COORDINATOR from a second instance."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from eos_protocol.common import MAX_PRODUCER_EPOCH, TopicPartition
from eos_protocol.errors import InvalidProducerEpochError
from partition_service.coordinators import CoordinatorPool
from partition_service.verification import CoordinatorVerifier
from tests.coordinator.helpers import add, code, describe, end, init, ok, topic, transaction_row
from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes, InProcessCoordinator

V2 = {"transaction_version": 2}


def _internal(coordinator: InProcessCoordinator) -> httpx.Client:
    return httpx.Client(
        base_url=coordinator.url, timeout=30,
        headers={"authorization": f"Bearer {INTERNAL_TOKEN}"},
    )


def node_add(client: httpx.Client, pid: int, epoch: int, partition: int,
             topic_name: str = "orders") -> httpx.Response:
    return client.post(
        f"/internal/v1/producers/{pid}/partitions",
        json={"producer_epoch": epoch, "topic": topic_name, "partition": partition},
    )



def test_init_opts_in_and_old_clients_see_no_new_field(
    coordinator: InProcessCoordinator, pg_url: str
) -> None:
    with coordinator.client() as c:
        answer = ok(c.post("/v1/transactions/new/init", json=V2))
        assert answer["transaction_version"] == 2 and answer["producer_epoch"] == 0
        assert transaction_row(pg_url, "new")["transaction_version"] == 2
        old = ok(c.post("/v1/transactions/old/init", json={}))
        assert set(old) == {"producer_id", "producer_epoch"}  # exactly today's answer
        assert transaction_row(pg_url, "old")["transaction_version"] == 1
        refused = c.post("/v1/transactions/x/init", json={"transaction_version": 3})
        assert refused.status_code == 422 and code(refused) == "INVALID_REQUEST"


def test_node_add_starts_the_transaction_and_every_end_bumps_the_epoch(
    coordinator: InProcessCoordinator, fake_nodes: FakeNodes, pg_url: str
) -> None:
    with coordinator.client() as c, _internal(coordinator) as node:
        topic(c)
        pid, epoch = init(c, "v2", **V2)
        for round_ in range(3):
            view = ok(node_add(node, pid, epoch, 1))
            assert view["state"] == "Ongoing" and view["transaction_version"] == 2
            assert view["partitions"] == [{"topic": "orders", "partition": 1}]
            ok(node_add(node, pid, epoch, 2))  # a second partition joins
            assert ok(node_add(node, pid, epoch, 1)) == {**view, "partitions": [
                {"topic": "orders", "partition": 1}, {"topic": "orders", "partition": 2}]}
            action = "commit" if round_ % 2 == 0 else "abort"
            answer = ok(end(c, "v2", pid, epoch, action))
            assert answer["producer_id"] == pid and answer["producer_epoch"] == epoch + 1
            # the markers carry the bumped epoch: each partition fences the ended one
            markers = [m for _n, m in fake_nodes.markers_for(pid)
                       if m["producer_epoch"] == epoch + 1]
            assert markers and {m["result"] for m in markers} == {action.upper()}
            # the same end again (its answer lost) gets the same answer, nothing more
            assert ok(end(c, "v2", pid, epoch, action)) == answer
            # a late add at the ended epoch is fenced and opens nothing
            assert code(node_add(node, pid, epoch, 3)) == "PRODUCER_FENCED"
            assert describe(c, "v2")["state"] in ("CompleteCommit", "CompleteAbort")
            # the other decision at the ended epoch is no retry
            other = "abort" if action == "commit" else "commit"
            assert code(end(c, "v2", pid, epoch, other)) == "PRODUCER_FENCED"
            # nothing is open at the new epoch: there is nothing to end
            assert code(end(c, "v2", pid, epoch + 1, action)) == "INVALID_TXN_STATE"
            epoch += 1
        assert transaction_row(pg_url, "v2")["producer_epoch"] == epoch


def test_a_version_1_producer_is_verified_not_added(coordinator: InProcessCoordinator) -> None:
    with coordinator.client() as c, _internal(coordinator) as node:
        topic(c)
        pid, epoch = init(c, "v1")
        view = ok(node_add(node, pid, epoch, 1))
        assert view["state"] == "Empty" and view["partitions"] == []
        assert view["transaction_version"] == 1
        assert describe(c, "v1")["state"] == "Empty"
        ok(add(c, "v1", pid, epoch, 1))
        answer = ok(end(c, "v1", pid, epoch))
        assert set(answer) == {"transactional_id", "state"}  # no epoch bump, no new field
        assert describe(c, "v1")["producer_epoch"] == epoch


def test_bad_input_to_the_add_route_changes_nothing(
    coordinator: InProcessCoordinator, pg_url: str
) -> None:
    with coordinator.client() as c, _internal(coordinator) as node:
        topic(c)
        pid, epoch = init(c, "bad", **V2)
        before = transaction_row(pg_url, "bad")
        cases: list[tuple[httpx.Response, int, str]] = [
            (node_add(node, pid + 999, 0, 1), 404, "UNKNOWN_PRODUCER_ID"),
            (node_add(node, pid, epoch + 1, 1), 409, "INVALID_PRODUCER_EPOCH"),
            (node_add(node, pid, epoch, 1, topic_name="nope"), 404,
             "UNKNOWN_TOPIC_OR_PARTITION"),
            (node.post(f"/internal/v1/producers/{pid}/partitions",
                       json={"producer_epoch": epoch, "topic": "orders"}), 422,
             "INVALID_REQUEST"),
            (node.post(f"/internal/v1/producers/{pid}/partitions",
                       json={"producer_epoch": -1, "topic": "orders", "partition": 1}), 422,
             "INVALID_REQUEST"),
            (node.post(f"/internal/v1/producers/{pid}/partitions", content=b"{not json",
                       headers={"content-type": "application/json"}), 422, "INVALID_REQUEST"),
            (node.post("/internal/v1/producers/-1/partitions",
                       json={"producer_epoch": 0, "topic": "orders", "partition": 1}), 422,
             "INVALID_REQUEST"),
            (c.post(f"/internal/v1/producers/{pid}/partitions",  # no internal token
                    json={"producer_epoch": epoch, "topic": "orders", "partition": 1}), 401,
             "UNAUTHENTICATED"),
        ]
        for response, status, error in cases:
            assert response.status_code == status, response.text
            body = response.json()["error"]
            assert body["code"] == error and isinstance(body["message"], str)
            assert body["retriable"] is False
        assert transaction_row(pg_url, "bad") == before
        # and the id still works
        assert ok(node_add(node, pid, epoch, 1))["state"] == "Ongoing"


def test_the_bumped_epoch_survives_a_restart(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    first = coordinator_factory()
    with first.client() as c, _internal(first) as node:
        topic(c)
        pid, epoch = init(c, "r", **V2)
        ok(node_add(node, pid, epoch, 0))
        answer = ok(end(c, "r", pid, epoch, wait=False))
        assert answer["producer_epoch"] == epoch + 1
    first.stop()
    second = coordinator_factory()
    with second.client() as c, _internal(second) as node:
        # the new owner loads the bumped epoch with the decision and finishes the markers
        described = describe(c, "r")
        assert described["producer_epoch"] == epoch + 1
        assert ok(end(c, "r", pid, epoch))["producer_epoch"] == epoch + 1  # the retry
        assert code(node_add(node, pid, epoch, 1)) == "PRODUCER_FENCED"
        assert ok(node_add(node, pid, epoch + 1, 1))["state"] == "Ongoing"
        assert ok(end(c, "r", pid, epoch + 1))["producer_epoch"] == epoch + 2


def test_an_end_at_the_top_epoch_hands_out_a_new_producer_id(
    coordinator_factory: Any, pg_url: str, fake_nodes: FakeNodes
) -> None:
    first = coordinator_factory()
    with first.client() as c:
        pid, _ = init(c, "top", **V2)
    first.stop()
    top = MAX_PRODUCER_EPOCH - 1
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE transactions SET producer_epoch = :e"), {"e": top})
    engine.dispose()
    second = coordinator_factory()
    with second.client() as c, _internal(second) as node:
        topic(c)
        ok(node_add(node, pid, top, 0))
        answer = ok(end(c, "top", pid, top))
        new_pid = answer["producer_id"]
        assert new_pid != pid and answer["producer_epoch"] == 0
        markers = fake_nodes.markers_for(pid)
        assert markers and all(m["producer_epoch"] == MAX_PRODUCER_EPOCH for _n, m in markers)
        assert ok(end(c, "top", pid, top)) == answer  # a retry still finds it
        # the old id belongs to nobody now: a late batch of it has nothing to join
        assert code(node_add(node, pid, top, 1)) == "UNKNOWN_PRODUCER_ID"
        assert ok(node_add(node, new_pid, 0, 1))["producer_id"] == new_pid
        assert ok(end(c, "top", new_pid, 0)) == {
            "transactional_id": "top", "state": "CompleteCommit",
            "producer_id": new_pid, "producer_epoch": 1,
        }
    assert transaction_row(pg_url, "top")["next_producer_id"] == -1


def test_the_node_follows_not_coordinator_to_the_owner(
    coordinator_factory: Any, pg_url: str
) -> None:
    owner = coordinator_factory(background=False)
    other = coordinator_factory(background=False)
    assert not other.services.leases.owned
    with owner.client() as c, _internal(other) as node:
        topic(c)
        pid, epoch = init(c, "follow", **V2)
        refused = node_add(node, pid, epoch, 1)
        assert refused.status_code == 503 and code(refused) == "NOT_COORDINATOR"
        assert refused.json()["error"]["details"]["coordinator_url"] == owner.url
        assert describe(c, "follow")["state"] == "Empty"

    async def verify() -> None:
        # the node knows only the instance that does not own the id
        verifier = CoordinatorVerifier(CoordinatorPool([other.url], INTERNAL_TOKEN, timeout_s=5))
        try:
            tp = TopicPartition(topic="orders", partition=1)
            assert (await verifier.verify(pid, epoch, tp)).transactional_id == "follow"
            # remembered: the next add goes straight to the owner
            again = await verifier.verify(pid, epoch, TopicPartition(topic="orders", partition=2))
            assert again.transactional_id == "follow" and again.transaction_version == 2
            with pytest.raises(InvalidProducerEpochError):  # passed on from the owner
                await verifier.verify(pid, epoch + 1, tp)
        finally:
            await verifier.pool.close()

    asyncio.run(verify())
    with owner.client() as c:
        described = describe(c, "follow")
        assert described["state"] == "Ongoing"
        assert described["partitions"] == [
            {"topic": "orders", "partition": 1}, {"topic": "orders", "partition": 2}]
        row = transaction_row(pg_url, "follow")
        assert json.loads(row["partitions"]) == [["orders", 1], ["orders", 2]]


def test_after_an_admin_abort_the_producer_may_abort_and_go_on(
    coordinator: InProcessCoordinator,
) -> None:
    """A fence bumps the epoch as an end does: the fenced producer's commit is refused,
    its abort agrees with what happened and hands it the new epoch."""
    with coordinator.client() as c, _internal(coordinator) as node:
        topic(c)
        pid, epoch = init(c, "hung", **V2)
        ok(node_add(node, pid, epoch, 0))
        ok(c.post("/v1/admin/transactions/hung/abort", json={}))
        assert code(end(c, "hung", pid, epoch, "commit")) == "PRODUCER_FENCED"
        assert code(node_add(node, pid, epoch, 1)) == "PRODUCER_FENCED"
        answer = ok(end(c, "hung", pid, epoch, "abort"))
        assert (answer["state"], answer["producer_epoch"]) == ("CompleteAbort", epoch + 1)
        assert ok(node_add(node, pid, epoch + 1, 1))["state"] == "Ongoing"
