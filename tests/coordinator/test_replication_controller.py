"""The controller on a real PostgreSQL migrated by Alembic (docs/design.md §7): elections
when a leader's heartbeats stop, ISR shrinks, leaderless partitions and their return,
unclean elections, the compare-and-set that lets only one of two racing controllers
write, partitions of one replica left as they were, and markers that follow a leader.

The lease clock is fake and the background loops are off: each test beats for the nodes
it wants alive, moves the clock and runs controller rounds itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import sqlalchemy as sa

from coordinator_service.clock import FakeClock
from coordinator_service.controller.controller import Controller
from coordinator_service.controller.election import decide
from coordinator_service.controller.partition_state import (
    ControllerFence,
    compare_and_set,
    place_replicas,
    read_state,
)
from coordinator_service.db.engine import Database, make_engine
from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import add, end, init, ok, state_of
from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes, InProcessCoordinator
from tests.support.processes import wait_until

INTERNAL = {"authorization": f"Bearer {INTERNAL_TOKEN}"}
SESSION_MS = 2_000


class LeaderAwareNodes(FakeNodes):
    """``FakeNodes`` that answer NOT_LEADER_OR_FOLLOWER to a marker for a partition whose
    leader (``leads``) is another node, as a real follower does, and keep the states the
    controller pushes."""

    def __init__(self) -> None:
        super().__init__((1, 2, 3))
        self.leads: dict[tuple[str, int], int] = {}
        self.pushed: list[tuple[int, str, int, dict[str, Any]]] = []

    def _handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "PUT" and path.endswith("/state"):
            node = int(request.url.host.removeprefix("node").split(".")[0])
            _, _, _, _, topic, partition, _ = path.split("/")
            self.pushed.append((node, topic, int(partition), orjson.loads(request.content)))
            return httpx.Response(200, json={"applied": True})
        answer = super()._handle(request)
        if request.url.path != "/internal/v1/markers" or answer.status_code != 200:
            return answer
        node = int(request.url.host.removeprefix("node").split(".")[0])
        results = orjson.loads(answer.read())["results"]
        for r in results:
            if self.leads.get((r["topic"], r["partition"]), node) != node:
                r["error"] = "NOT_LEADER_OR_FOLLOWER"
        return httpx.Response(200, json={"results": results})


@pytest.fixture
def fake_nodes() -> LeaderAwareNodes:
    return LeaderAwareNodes()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coordinator(coordinator_factory: CoordinatorFactory, clock: FakeClock) -> InProcessCoordinator:
    return coordinator_factory(
        lease_clock=clock, background=False, node_session_timeout_ms=SESSION_MS,
        metadata_refresh_ms=600_000,  # leaders move only when a test makes them
    )


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[httpx.Client]:
    with coordinator.client() as c:
        yield c


def beat(client: httpx.Client, *nodes: int) -> None:
    for node in nodes:
        ok(client.post(f"/internal/v1/nodes/{node}/heartbeat",
                       json={"url": f"http://node{node}.test"}, headers=INTERNAL))


def run_round(coordinator: InProcessCoordinator) -> int:
    return coordinator.call(coordinator.services.controller.run_once)


def partitions(client: httpx.Client, topic: str) -> list[dict[str, Any]]:
    return list(ok(client.get(f"/v1/topics/{topic}"))["partitions"])


def create(client: httpx.Client, name: str, count: int, rf: int, **more: Any) -> list[
    dict[str, Any]
]:
    body = {"name": name, "partitions": count, "replication_factor": rf, **more}
    return list(ok(client.post("/v1/topics", json=body))["partitions"])


def metric(client: httpx.Client, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start!r}")


def silence(clock: FakeClock, client: httpx.Client, *alive: int) -> None:
    """Let the session timeout pass with only ``alive`` beating."""
    clock.advance(SESSION_MS // 2)
    beat(client, *alive)
    clock.advance(SESSION_MS // 2 + 1)
    beat(client, *alive)


def test_a_leader_whose_heartbeats_stop_is_replaced_and_dropped_from_every_isr(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock,
    fake_nodes: LeaderAwareNodes,
) -> None:
    before = create(client, "orders", 6, 3)
    # the creation was answered once every replica had its partition's first state
    first = {(n, "orders", p["partition"]) for p in before for n in p["replicas"]}
    assert {(n, t, q) for n, t, q, _ in fake_nodes.pushed} == first
    assert all(body["partition_epoch"] == 0 for *_, body in fake_nodes.pushed)
    fake_nodes.pushed.clear()
    beat(client, 1, 2, 3)
    assert run_round(coordinator) == 0
    silence(clock, client, 2, 3)
    assert run_round(coordinator) == 6  # every partition has node 1 as a replica
    after = partitions(client, "orders")
    led_by_1 = 0
    for old, new in zip(before, after, strict=True):
        assert 1 not in new["isr"] and new["under_replicated"]
        if old["leader"]["node_id"] == 1:
            led_by_1 += 1
            expected = next(r for r in old["replicas"] if r != 1)
            assert new["leader"] == {"node_id": expected, "url": f"http://node{expected}.test"}
            assert new["leader_epoch"] == 1
        else:
            assert new["leader"] == old["leader"] and new["leader_epoch"] == 0
    assert led_by_1 == 2
    assert metric(client, 'eos_coordinator_leader_elections_total{kind="clean"}') == 2
    assert metric(client, "eos_coordinator_isr_shrinks_total") == 6
    assert metric(client, "eos_coordinator_under_replicated_partitions") == 6
    assert run_round(coordinator) == 0  # settled
    # every replica is told at once ...
    expected_pushes = {(n, "orders", p["partition"]) for p in after for n in p["replicas"]}
    wait_until(lambda: {(n, t, q) for n, t, q, _ in fake_nodes.pushed} >= expected_pushes,
               timeout=10, what="the new states pushed to the replicas")
    for n, _t, q, body in fake_nodes.pushed:
        assert body["leader"] == after[q]["leader"]["node_id"]
        assert (body["isr"], body["partition_epoch"]) == (after[q]["isr"], 1)
        assert body["nodes"] == {str(i): f"http://node{i}.test" for i in (1, 2, 3)}
        assert n in body["replicas"]
    # ... and learns it again from its heartbeats
    answer = ok(client.post("/internal/v1/nodes/2/heartbeat", json={"url": "http://node2.test"},
                            headers=INTERNAL))
    states = {s["partition"]: s for s in answer["partitions"] if s["topic"] == "orders"}
    for p in after:
        if 2 in p["replicas"]:
            s = states[p["partition"]]
            assert (s["leader"], s["isr"], s["partition_epoch"]) == (
                p["leader"]["node_id"], p["isr"], 1)


def test_no_live_isr_member_means_no_leader_until_one_returns(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock
) -> None:
    (p,) = create(client, "solo", 1, 2)
    first, second = p["replicas"]
    third = ({1, 2, 3} - {first, second}).pop()
    beat(client, 1, 2, 3)
    silence(clock, client, first, third)
    assert run_round(coordinator) == 1  # the follower leaves the ISR
    assert partitions(client, "solo")[0]["isr"] == [first]
    silence(clock, client, second, third)  # the leader dies, the follower is back
    assert run_round(coordinator) == 1
    (now,) = partitions(client, "solo")
    assert now["leader"] == {"node_id": -1, "url": ""}
    assert (now["isr"], now["leader_epoch"]) == ([first], 1)
    assert metric(client, "eos_coordinator_offline_partitions") >= 1
    assert run_round(coordinator) == 0  # the out-of-sync follower is not elected
    beat(client, first)  # the last in-sync replica comes back
    assert run_round(coordinator) == 1
    (back,) = partitions(client, "solo")
    assert (back["leader"]["node_id"], back["isr"], back["leader_epoch"]) == (first, [first], 2)


def test_an_unclean_election_only_on_a_topic_that_allows_it(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock
) -> None:
    (clean,) = create(client, "careful", 1, 2)
    # a second topic on the same replicas, in the same order
    twin = next(f"careless-{i}" for i in range(100)
                if place_replicas(f"careless-{i}", 1, [1, 2, 3], 2)[0] == tuple(clean["replicas"]))
    create(client, twin, 1, 2, unclean_leader_election=True)
    leader, follower = clean["replicas"]
    third = ({1, 2, 3} - {leader, follower}).pop()
    beat(client, 1, 2, 3)
    silence(clock, client, leader, third)
    assert run_round(coordinator) == 2  # the follower leaves both ISRs
    silence(clock, client, follower, third)  # the leader dies, the follower is back
    assert run_round(coordinator) == 2
    (c,) = partitions(client, "careful")
    assert (c["leader"]["node_id"], c["isr"]) == (-1, [leader])
    (u,) = partitions(client, twin)
    assert (u["leader"]["node_id"], u["isr"], u["leader_epoch"]) == (follower, [follower], 1)
    assert metric(client, 'eos_coordinator_leader_elections_total{kind="unclean"}') == 1
    assert metric(client, 'eos_coordinator_leader_elections_total{kind="clean"}') == 0


def test_a_fresh_controller_waits_a_session_timeout_for_nodes_never_heard_from(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock
) -> None:
    create(client, "fresh", 2, 3)
    assert run_round(coordinator) == 0
    clock.advance(SESSION_MS - 10)
    beat(client, 2, 3)
    assert run_round(coordinator) == 0  # node 1 has not been heard from, but it is early
    clock.advance(20)
    beat(client, 2, 3)
    assert run_round(coordinator) == 2
    assert all(1 not in p["isr"] for p in partitions(client, "fresh"))


def test_partitions_of_one_replica_never_change(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock
) -> None:
    before = create(client, "plain", 3, 1)
    beat(client, 1, 2, 3)
    silence(clock, client)  # every node dead
    clock.advance(10 * SESSION_MS)
    assert run_round(coordinator) == 0
    after = partitions(client, "plain")
    assert after == before
    assert all(p["leader"]["node_id"] in (1, 2, 3) and p["leader_epoch"] == 0 for p in after)
    offsets = partitions(client, "__consumer_offsets")
    assert all(p["replicas"] == [p["leader"]["node_id"]] for p in offsets)


def test_racing_controllers_write_one_new_epoch(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock, pg_url: str
) -> None:
    (p,) = create(client, "race", 1, 3)
    beat(client, 1, 2, 3)
    assert run_round(coordinator) == 0  # the in-process coordinator is the controller
    controller = coordinator.services.controller
    assert controller.epoch is not None
    engine = make_engine(pg_url, pool_size=2)
    try:
        with engine.begin() as conn:
            stored = read_state(conn, "race", 0)
        assert stored is not None
        dead = p["replicas"][0]
        change = decide(stored, lambda n: n != dead)
        assert change is not None
        fence = ControllerFence(controller.instance_id, controller.epoch, clock.now_ms())
        with engine.begin() as conn:
            first = compare_and_set(conn, stored, change.leader, change.isr, fence)
        with engine.begin() as conn:  # the same decision from the same read: too late
            second = compare_and_set(conn, stored, change.leader, change.isr, fence)
        assert first is not None and second is None
        with engine.begin() as conn:
            now = read_state(conn, "race", 0)
        assert now == first
        assert (now.leader_epoch, now.partition_epoch) == (1, 1)
        # a second instance cannot take the controller lease while it is held, and a
        # write fenced by a lease it does not hold changes nothing
        rival = Controller(
            Database(engine, threads=2), instance_id="rival", url="http://rival", node_id=99,
            clock=clock, lease_ms=10_000, session_timeout_ms=SESSION_MS, interval_ms=200,
        )
        assert coordinator.call(rival.run_once) == 0
        assert rival.epoch is None
        forged = ControllerFence("rival", controller.epoch, clock.now_ms())
        with engine.begin() as conn:
            assert compare_and_set(conn, now, -1, now.isr, forged) is None
    finally:
        engine.dispose()


def test_a_bad_row_is_set_aside_and_the_others_are_still_elected(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock, pg_url: str
) -> None:
    create(client, "broken", 1, 2)
    create(client, "healthy", 3, 3)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE topic_partitions SET isr = 'not json' "
                             "WHERE topic = 'broken'"))
    engine.dispose()
    beat(client, 1, 2, 3)
    silence(clock, client, 2, 3)
    assert run_round(coordinator) == 3
    assert all(1 not in p["isr"] for p in partitions(client, "healthy"))
    set_aside = 'eos_coordinator_background_entries_set_aside_total{loop="controller"}'
    assert metric(client, set_aside) == 1
    assert run_round(coordinator) == 0
    assert metric(client, set_aside) == 1  # reported once, not at every round


def test_markers_follow_the_leader_after_an_election(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock,
    fake_nodes: LeaderAwareNodes,
) -> None:
    (p,) = create(client, "moving", 1, 2)
    old, new = p["replicas"]
    beat(client, 1, 2, 3)
    pid, epoch = init(client, "t-move")
    ok(add(client, "t-move", pid, epoch, 0, topic="moving"))
    fake_nodes.down.add(old)
    ok(end(client, "t-move", pid, epoch, wait=False))
    silence(clock, client, *({1, 2, 3} - {old}))
    assert run_round(coordinator) >= 1
    wait_until(lambda: state_of(coordinator.url, "t-move") == "CompleteCommit", timeout=20,
               interval=0.05, what="the commit's markers on the new leader")
    assert [n for n, _ in fake_nodes.markers_for(pid)] == [new]


def test_a_not_leader_answer_sends_the_marker_to_the_current_leader(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock,
    fake_nodes: LeaderAwareNodes, pg_url: str,
) -> None:
    (p,) = create(client, "moved", 1, 2)
    old, new = p["replicas"]
    beat(client, 1, 2, 3)
    pid, epoch = init(client, "t-moved")
    ok(add(client, "t-moved", pid, epoch, 0, topic="moved"))
    # The leader moves behind this coordinator's back (its cache refreshes only on demand).
    engine = make_engine(pg_url, pool_size=1)
    with engine.begin() as conn:
        stored = read_state(conn, "moved", 0)
        assert stored is not None
        assert compare_and_set(conn, stored, new, (new,)) is not None
    engine.dispose()
    fake_nodes.leads[("moved", 0)] = new
    ok(end(client, "t-moved", pid, epoch, wait=True))
    assert state_of(coordinator.url, "t-moved") == "CompleteCommit"
    answers = [n for n, _ in fake_nodes.markers_for(pid)]
    assert answers[0] == old and answers[-1] == new


def test_rounds_read_every_partition_only_when_the_live_nodes_change_or_a_session_passed(
    coordinator: InProcessCoordinator, client: httpx.Client, clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle cluster's controller reads the heartbeats each round and the partition
    states only when a node died or came back, or once a session timeout."""
    create(client, "idle", 4, 3)
    full_reads: list[int] = []
    controller = coordinator.services.controller
    real = controller._states

    def counted(conn: Any) -> Any:
        full_reads.append(clock.now_ms())
        return real(conn)

    monkeypatch.setattr(controller, "_states", counted)
    beat(client, 1, 2, 3)
    run_round(coordinator)
    first = len(full_reads)
    assert first == 1
    for _ in range(5):
        clock.advance(SESSION_MS // 10)
        beat(client, 1, 2, 3)
        assert run_round(coordinator) == 0
    assert len(full_reads) == first  # nothing changed: heartbeats only
    clock.advance(SESSION_MS // 2)
    beat(client, 1, 2, 3)
    run_round(coordinator)
    assert len(full_reads) == first + 1  # a session timeout passed since the last one
    silence(clock, client, 2, 3)
    assert run_round(coordinator) == 4  # node 1 died: read at once, every partition moved
    assert len(full_reads) == first + 2
