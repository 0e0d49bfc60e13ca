"""Replication through the coordinator's HTTP API on a real PostgreSQL migrated by
Alembic: topics with a replication factor, node heartbeats, AlterPartition, and the
migration of a database from before replication (docs/design.md §7). Storage nodes are
``FakeNodes``; the lease clock is fake, so liveness is decided by hand."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from coordinator_service.clock import FakeClock
from coordinator_service.db.engine import make_engine, upgrade
from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import code, ok
from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes, InProcessCoordinator
from tests.support.processes import wait_until

INTERNAL = {"authorization": f"Bearer {INTERNAL_TOKEN}"}
SESSION_MS = 2_000


@pytest.fixture
def fake_nodes() -> FakeNodes:
    return FakeNodes((1, 2, 3))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coordinator(coordinator_factory: CoordinatorFactory, clock: FakeClock) -> InProcessCoordinator:
    return coordinator_factory(
        lease_clock=clock, background=False, node_session_timeout_ms=SESSION_MS
    )


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[httpx.Client]:
    with coordinator.client() as c:
        yield c


def beat(client: httpx.Client, node: int) -> dict[str, Any]:
    return dict(ok(client.post(f"/internal/v1/nodes/{node}/heartbeat",
                               json={"url": f"http://node{node}.test"}, headers=INTERNAL)))


def create(client: httpx.Client, name: str, partitions: int, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/topics", json={"name": name, "partitions": partitions, **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


# --- topics ------------------------------------------------------------------------------


def test_a_replicated_topic_is_placed_on_distinct_nodes_and_created_on_every_replica(
    client: httpx.Client, fake_nodes: FakeNodes
) -> None:
    made = create(client, "orders", 6, replication_factor=3)
    assert (made["replication_factor"], made["min_insync_replicas"]) == (3, 2)
    leaders = []
    for p in made["partitions"]:
        assert len(set(p["replicas"])) == 3
        assert p["isr"] == p["replicas"]
        assert p["leader"]["node_id"] == p["replicas"][0]
        assert p["leader"]["url"] == f"http://node{p['replicas'][0]}.test"
        assert (p["leader_epoch"], p["under_replicated"], p["created_on_node"]) == (0, False, True)
        leaders.append(p["leader"]["node_id"])
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert {(n, t, p) for n, t, p in fake_nodes.created if t == "orders"} == {
        (n, "orders", p) for p in range(6) for n in (1, 2, 3)
    }
    assert ok(client.get("/v1/topics/orders")) == made
    listed = {t["name"]: t for t in ok(client.get("/v1/metadata"))["topics"]}
    assert listed["orders"] == made
    two = create(client, "pairs", 3, replication_factor=2, min_insync_replicas=1)
    assert (two["replication_factor"], two["min_insync_replicas"]) == (2, 1)


def test_a_replica_that_is_away_is_asked_again_until_every_replica_has_it(
    coordinator: InProcessCoordinator, client: httpx.Client, fake_nodes: FakeNodes
) -> None:
    fake_nodes.down.add(3)
    made = create(client, "later", 3, replication_factor=3)
    assert [p["created_on_node"] for p in made["partitions"]] == [False] * 3
    fake_nodes.down.clear()
    assert coordinator.call(coordinator.services.metadata.reconcile_once) == 0
    made = ok(client.get("/v1/topics/later"))
    assert [p["created_on_node"] for p in made["partitions"]] == [True] * 3


def test_more_replicas_than_nodes_is_refused_and_writes_nothing(
    client: httpx.Client, db: sa.Engine
) -> None:
    response = client.post("/v1/topics", json={"name": "big", "partitions": 2,
                                               "replication_factor": 4})
    assert response.status_code == 400
    assert code(response) == "INVALID_REQUEST"
    assert "storage nodes (3)" in response.json()["error"]["message"]
    response = client.post("/v1/topics", json={"name": "big", "partitions": 2,
                                               "replication_factor": 2,
                                               "min_insync_replicas": 3})
    assert code(response) == "INVALID_REQUEST"
    with db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM topics WHERE name = 'big'")).scalar() == 0
        assert conn.execute(
            sa.text("SELECT count(*) FROM topic_partitions WHERE topic = 'big'")
        ).scalar() == 0
    assert client.get("/v1/topics/big").status_code == 404


def test_the_default_replication_factor_is_the_coordinators(
    coordinator_factory: CoordinatorFactory, clock: FakeClock
) -> None:
    coordinator = coordinator_factory(lease_clock=clock, background=False,
                                      default_replication_factor=2)
    with coordinator.client() as c:
        made = create(c, "defaulted", 2)
        assert made["replication_factor"] == 2
        assert all(len(p["replicas"]) == 2 for p in made["partitions"])
        offsets = ok(c.get("/v1/topics/__consumer_offsets"))
        assert offsets["replication_factor"] == 2


# --- heartbeats --------------------------------------------------------------------------


def test_a_heartbeat_answers_the_nodes_and_the_partitions_the_node_holds(
    client: httpx.Client, db: sa.Engine, clock: FakeClock
) -> None:
    made = create(client, "orders", 3, replication_factor=2)
    answer = beat(client, 2)
    assert answer["nodes"] == [{"node_id": n, "url": f"http://node{n}.test"} for n in (1, 2, 3)]
    mine = {(s["topic"], s["partition"]): s for s in answer["partitions"]}
    expected = [p for p in made["partitions"] if 2 in p["replicas"]]
    assert {k for k in mine if k[0] == "orders"} == {("orders", p["partition"]) for p in expected}
    for p in expected:
        s = mine[("orders", p["partition"])]
        assert s == {"topic": "orders", "partition": p["partition"],
                     "leader": p["leader"]["node_id"], "leader_epoch": 0, "partition_epoch": 0,
                     "replicas": p["replicas"], "isr": p["replicas"],
                     "min_insync_replicas": 2, "retention_ms": made["retention_ms"],
                     "retention_bytes": made["retention_bytes"]}
    # the offsets partitions (one replica each) led by node 2 are there too
    assert all(s["replicas"] == [2] for k, s in mine.items() if k[0] == "__consumer_offsets")
    assert any(k[0] == "__consumer_offsets" for k in mine)
    with db.connect() as conn:
        row = conn.execute(sa.text("SELECT url, heartbeat_ms FROM node_heartbeats "
                                   "WHERE node_id = 2")).one()
    assert tuple(row) == ("http://node2.test", clock.now_ms())
    clock.advance(500)
    ok(client.post("/internal/v1/nodes/2/heartbeat", json={}, headers=INTERNAL))  # no URL
    with db.connect() as conn:
        again = conn.execute(sa.text("SELECT heartbeat_ms FROM node_heartbeats")).scalar()
    assert again == clock.now_ms()


def test_a_heartbeat_leaves_out_the_states_the_node_already_has(client: httpx.Client) -> None:
    """The answer's digest, sent back as ``known_states``, spares the node its states
    while they stay the same; any change (an ISR altered, a new topic) brings them all
    back under a new digest, and a digest the coordinator never gave is answered in full."""
    create(client, "orders", 3, replication_factor=3)

    def beat_knowing(known: str | None) -> dict[str, Any]:
        body = {"url": "http://node2.test", "incarnation": "one"}
        if known is not None:
            body["known_states"] = known
        return dict(ok(client.post("/internal/v1/nodes/2/heartbeat", json=body,
                                   headers=INTERNAL)))  # fmt: skip

    full = beat_knowing(None)
    digest = full["states_digest"]
    assert full["unchanged"] is False and len(full["partitions"]) >= 3
    spared = beat_knowing(digest)
    assert (spared["unchanged"], spared["partitions"], spared["states_digest"]) == (
        True, [], digest)
    assert spared["nodes"] == full["nodes"]
    assert beat_knowing("a-digest-never-given")["partitions"] == full["partitions"]

    state = next(s for s in full["partitions"] if s["topic"] == "orders")
    smaller = [r for r in state["isr"] if r != 2 or r == state["leader"]]
    if smaller == state["isr"]:
        smaller = [state["leader"]]
    ok(client.post(f"/internal/v1/partitions/orders/{state['partition']}/isr", json={
        "leader": state["leader"], "leader_epoch": state["leader_epoch"],
        "partition_epoch": state["partition_epoch"], "isr": smaller}, headers=INTERNAL))
    changed = beat_knowing(digest)
    assert changed["unchanged"] is False and changed["states_digest"] != digest
    altered = next(s for s in changed["partitions"]
                   if (s["topic"], s["partition"]) == ("orders", state["partition"]))
    assert altered["isr"] == smaller

    create(client, "more", 3, replication_factor=3)
    again = beat_knowing(changed["states_digest"])
    assert {s["topic"] for s in again["partitions"]} >= {"orders", "more"}


def test_a_known_node_is_answered_while_its_beat_waits_for_the_database(
    client: httpx.Client, db: sa.Engine, clock: FakeClock
) -> None:
    """A beat of a node this instance has written (same incarnation) is answered at once
    and written behind the answer: a heartbeats table locked by another transaction (a
    topic of a thousand partitions being recorded) must not make the beats late. A new
    incarnation waits for its own write."""
    body = {"url": "http://node3.test", "incarnation": "first"}
    ok(client.post("/internal/v1/nodes/3/heartbeat", json=body, headers=INTERNAL))
    with db.connect() as locker, ThreadPoolExecutor(1) as pool:
        locker.execute(sa.text("SELECT * FROM node_heartbeats WHERE node_id = 3 FOR UPDATE"))
        clock.advance(700)
        answered = pool.submit(client.post, "/internal/v1/nodes/3/heartbeat", json=body,
                               headers=INTERNAL)  # fmt: skip
        try:
            ok(answered.result(timeout=10))  # a beat that waits for the row times out here
            with db.connect() as conn:
                stored = conn.execute(sa.text(
                    "SELECT heartbeat_ms FROM node_heartbeats WHERE node_id = 3")).scalar()
            assert stored == clock.now_ms() - 700  # not written yet: the row is locked
        finally:
            locker.rollback()

    def written() -> bool:
        with db.connect() as conn:
            return conn.execute(sa.text(
                "SELECT heartbeat_ms FROM node_heartbeats WHERE node_id = 3")
            ).scalar() == clock.now_ms()

    wait_until(written, timeout=20, what="the beat written once the lock is gone")


def test_replication_endpoints_need_the_internal_token(client: httpx.Client) -> None:
    create(client, "orders", 1, replication_factor=2)
    response = client.post("/internal/v1/nodes/1/heartbeat", json={"url": "http://x"})
    assert response.status_code == 401
    response = client.post("/internal/v1/partitions/orders/0/isr", json={
        "leader": 1, "leader_epoch": 0, "partition_epoch": 0, "isr": [1]})
    assert response.status_code == 401


# --- AlterPartition ----------------------------------------------------------------------


def alter(client: httpx.Client, partition: dict[str, Any], isr: list[int],
          **epochs: int) -> httpx.Response:
    body = {"leader": partition["leader"], "leader_epoch": partition["leader_epoch"],
            "partition_epoch": partition["partition_epoch"], "isr": isr, **epochs}
    return client.post(f"/internal/v1/partitions/{partition['topic']}/"
                       f"{partition['partition']}/isr", json=body, headers=INTERNAL)


def state_of(client: httpx.Client, node: int, topic: str, partition: int) -> dict[str, Any]:
    for s in beat(client, node)["partitions"]:
        if (s["topic"], s["partition"]) == (topic, partition):
            return dict(s)
    raise AssertionError(f"node {node} holds no {topic}/{partition}")


def test_alter_partition_shrinks_and_expands_the_isr_at_the_stored_epochs(
    client: httpx.Client
) -> None:
    made = create(client, "orders", 1, replication_factor=3)
    replicas = made["partitions"][0]["replicas"]
    leader, second, third = replicas
    for n in replicas:
        beat(client, n)
    before = state_of(client, leader, "orders", 0)
    shrunk = ok(alter(client, before, [leader, second]))
    assert (shrunk["isr"], shrunk["partition_epoch"], shrunk["leader_epoch"]) == (
        [leader, second], 1, 0)
    described = ok(client.get("/v1/topics/orders"))["partitions"][0]
    assert described["isr"] == [leader, second] and described["under_replicated"] is True
    grown = ok(alter(client, shrunk, [third, leader, second]))
    assert (grown["isr"], grown["partition_epoch"]) == (replicas, 2)
    assert ok(client.get("/v1/topics/orders"))["partitions"][0]["under_replicated"] is False
    assert "eos_coordinator_isr_expands_total 1.0" in client.get("/metrics").text


def test_alter_partition_at_old_epochs_is_fenced_with_the_stored_state(
    client: httpx.Client
) -> None:
    made = create(client, "orders", 1, replication_factor=2)
    leader, follower = made["partitions"][0]["replicas"]
    beat(client, leader)
    beat(client, follower)
    before = state_of(client, leader, "orders", 0)
    ok(alter(client, before, [leader]))
    for stale in (alter(client, before, [leader, follower]),  # partition epoch moved on
                  alter(client, before, [follower], leader=follower,
                        partition_epoch=1),  # not the leader
                  alter(client, before, [leader], leader_epoch=7, partition_epoch=1)):
        assert stale.status_code == 409, stale.text
        error = stale.json()["error"]
        assert (error["code"], error["retriable"]) == ("FENCED_LEADER_EPOCH", True)
        assert error["details"]["partition_epoch"] == 1
        assert error["details"]["isr"] == [leader]
        assert error["details"]["leader"] == leader


def test_alter_partition_refuses_an_isr_without_the_leader_strangers_or_dead_joiners(
    client: httpx.Client, clock: FakeClock
) -> None:
    made = create(client, "orders", 1, replication_factor=2)
    leader, follower = made["partitions"][0]["replicas"]
    stranger = ({1, 2, 3} - {leader, follower}).pop()
    beat(client, leader)
    beat(client, follower)
    before = state_of(client, leader, "orders", 0)
    shrunk = ok(alter(client, before, [leader]))
    for isr in ([follower], [leader, stranger]):
        response = alter(client, shrunk, isr)
        assert response.status_code == 400 and code(response) == "INVALID_REQUEST", isr
    clock.advance(SESSION_MS + 1)
    beat(client, leader)  # the follower is silent: it may not join
    response = alter(client, shrunk, [leader, follower])
    assert code(response) == "INVALID_REQUEST"
    assert "not alive" in response.json()["error"]["message"]
    beat(client, follower)
    assert ok(alter(client, shrunk, [leader, follower]))["isr"] == [leader, follower]
    missing = client.post("/internal/v1/partitions/nope/0/isr", headers=INTERNAL, json={
        "leader": 1, "leader_epoch": 0, "partition_epoch": 0, "isr": [1]})
    assert code(missing) == "UNKNOWN_TOPIC_OR_PARTITION"


# --- the migration -----------------------------------------------------------------------


def test_upgrading_from_0003_keeps_every_partition_on_its_one_node(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1)
    try:
        upgrade(engine, "0003")
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO topics (name, partitions, internal, created_ms) "
                                 "VALUES ('old', 2, false, 0)"))
            conn.execute(sa.text(
                "INSERT INTO topic_partitions (topic, partition, node_id, created_on_node) "
                "VALUES ('old', 0, 2, true), ('old', 1, 3, false)"))
            conn.execute(sa.text("INSERT INTO leases (log_partition) VALUES (0), (1)"))
        upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT partition, node_id, replicas, isr, leader_epoch, partition_epoch, "
                "created_replicas, created_on_node FROM topic_partitions ORDER BY partition"
            )).all()
            assert [tuple(r) for r in rows] == [
                (0, 2, "[2]", "[2]", 0, 0, "[2]", True),
                (1, 3, "[3]", "[3]", 0, 0, "[]", False),
            ]
            topic = conn.execute(sa.text(
                "SELECT replication_factor, min_insync_replicas, unclean_leader_election "
                "FROM topics")).one()
            assert tuple(topic) == (1, 1, False)
            keys = conn.execute(sa.text("SELECT log_partition FROM leases ORDER BY 1")).scalars()
            assert list(keys) == [-1, 0, 1]
            assert conn.execute(sa.text("SELECT count(*) FROM node_heartbeats")).scalar() == 0
    finally:
        engine.dispose()


def test_isr_changes_of_many_partitions_are_each_decided_on_their_own(
    client: httpx.Client,
) -> None:
    """The batched AlterPartition: one proposal taken, one at old epochs fenced with the
    stored state, one of an unknown partition and one without the leader refused; none
    fails the others."""
    create(client, "orders", 9, replication_factor=3)
    for n in (1, 2, 3):
        beat(client, n)
    states = [state_of(client, 1, "orders", p) for p in range(9)]
    leader = states[0]["leader"]
    first, second, third = [s for s in states if s["leader"] == leader][:3]

    def change(state: dict[str, Any], isr: list[int], **over: int) -> dict[str, Any]:
        return {"topic": "orders", "partition": state["partition"],
                "leader_epoch": state["leader_epoch"],
                "partition_epoch": state["partition_epoch"], "isr": isr, **over}  # fmt: skip

    shrunk = [leader, next(r for r in first["isr"] if r != leader)]
    body = {"leader": leader, "partitions": [
        change(first, shrunk),
        change(second, second["isr"], partition_epoch=second["partition_epoch"] + 5),
        {**change(first, shrunk), "topic": "absent"},
        change(third, [r for r in third["isr"] if r != leader]),
    ]}  # fmt: skip
    answer = ok(client.post("/internal/v1/isr-changes", json=body, headers=INTERNAL))
    taken, fenced, unknown, leaderless = answer["partitions"]
    assert taken["error"] is None and taken["state"]["isr"] == shrunk
    assert taken["state"]["partition_epoch"] == first["partition_epoch"] + 1
    assert fenced["error"]["code"] == "FENCED_LEADER_EPOCH"
    assert fenced["error"]["details"]["partition_epoch"] == second["partition_epoch"]
    assert unknown["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert leaderless["error"]["code"] == "INVALID_REQUEST"
    assert state_of(client, 1, "orders", first["partition"])["isr"] == shrunk
    assert state_of(client, 1, "orders", third["partition"])["isr"] == third["isr"]
    refused = client.post("/internal/v1/isr-changes", json={"leader": 1, "partitions": []},
                          headers=INTERNAL)  # fmt: skip
    assert code(refused) == "INVALID_REQUEST"


def test_a_node_that_restarted_leaves_every_isr_and_its_leadership(
    client: httpx.Client,
) -> None:
    """A heartbeat with another incarnation is a new process: what it had may be gone, so
    it is taken out of every ISR at once (it led: an in-sync replica takes over), even
    though it never missed the session timeout. The same incarnation again changes
    nothing; a node that never sent one is not judged."""
    made = create(client, "orders", 2, replication_factor=3)
    led = {p["partition"]: p["replicas"][0] for p in made["partitions"]}

    def heartbeat(node: int, incarnation: str | None) -> None:
        body = {"url": f"http://node{node}.test"}
        if incarnation is not None:
            body["incarnation"] = incarnation
        ok(client.post(f"/internal/v1/nodes/{node}/heartbeat", json=body, headers=INTERNAL))

    for n in (1, 2, 3):
        heartbeat(n, f"first-{n}")
    victim = led[0]
    heartbeat(victim, f"first-{victim}")  # the same process: nothing moves
    assert ok(client.get("/v1/topics/orders"))["partitions"] == made["partitions"]

    heartbeat(victim, "second")
    for p in ok(client.get("/v1/topics/orders"))["partitions"]:
        assert victim not in p["isr"] and p["under_replicated"], p
        if led[p["partition"]] == victim:
            assert p["leader"]["node_id"] not in (victim, -1) and p["leader_epoch"] == 1, p
    after = ok(client.get("/v1/topics/orders"))["partitions"]
    heartbeat(victim, "second")
    assert ok(client.get("/v1/topics/orders"))["partitions"] == after
