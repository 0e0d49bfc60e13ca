"""One poisoned entry must not stall the coordinator's calls to the storage nodes.

The partition reconciler and the marker channel both walk a queue of work per node. A
node that refuses one entry (a 4xx in the error envelope), an entry no URL can carry (a
topic ``..`` written by an older version), a node that is away and a node this coordinator
does not know each used to — or could — stop the queue at that entry. The nodes here are
``FakeNodes`` behind an httpx transport, told to refuse chosen topics the way a real node
refuses what it cannot hold; the coordinator and its PostgreSQL database are real.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
import sqlalchemy as sa

from tests.coordinator.helpers import add, describe, end, init, ok, topic
from tests.support.coordinators import FakeNodes
from tests.support.processes import wait_until

PARTITIONS = "/internal/v1/partitions/"
MARKERS = "/internal/v1/markers"


def envelope(status: int, code: str, message: str) -> httpx.Response:
    retriable = status == 503
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "retriable": retriable}}
    )


class PickyNodes(FakeNodes):
    """``FakeNodes`` that refuse chosen topics: partition creation answers the status set
    in ``refuse_create``; a marker request naming a topic of ``refuse_markers`` is refused
    as a whole (400, as a real node refuses a request it cannot validate); partitions of
    ``not_leader`` answer NOT_LEADER_OR_FOLLOWER (retriable) to every marker."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse_create: dict[str, int] = {}
        self.busy_once: set[str] = set()  # topics whose first creation call answers 503
        self.refuse_markers: set[str] = set()
        self.not_leader: set[tuple[str, int]] = set()
        self.create_calls: Counter[tuple[str, int]] = Counter()
        self.refused_marker_requests = 0

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        path = request.url.path
        if node in self.down:
            return super()._handle(request)
        if request.method == "PUT" and path.startswith(PARTITIONS):
            topic_name, partition = path.removeprefix(PARTITIONS).split("/")
            key = (topic_name, int(partition))
            self.create_calls[key] += 1
            status = self.refuse_create.get(topic_name)
            if topic_name in self.busy_once and self.create_calls[key] == 1:
                status = 503
            if status is not None:
                code = "KAFKA_STORAGE_ERROR" if status == 503 else "INVALID_REQUEST"
                return envelope(status, code, f"not holding {topic_name}")
        if request.method == "POST" and path == MARKERS:
            body = orjson.loads(request.content)
            named = {tp["topic"] for m in body["markers"] for tp in m["partitions"]}
            if named & self.refuse_markers:
                self.refused_marker_requests += 1
                return envelope(400, "INVALID_REQUEST", "a marker names a topic not held here")
            answer = super()._handle(request)
            results = answer.json()["results"]
            for r in results:
                if (r["topic"], r["partition"]) in self.not_leader:
                    r["error"] = "NOT_LEADER_OR_FOLLOWER"
            return httpx.Response(200, json={"results": results})
        return super()._handle(request)


@pytest.fixture
def fake_nodes() -> PickyNodes:
    return PickyNodes()


def metric(client: httpx.Client, line_start: str) -> float:
    """The value of the first ``/metrics`` line that starts with ``line_start``."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start!r}")


def created_topics(nodes: FakeNodes, prefix: str) -> set[tuple[str, int]]:
    return {(t, p) for _n, t, p in list(nodes.created) if t.startswith(prefix)}


def plant_topic(pg_url: str, name: str, leaders: list[int]) -> None:
    """A topic as a version that accepted any name wrote it, straight into the tables."""
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO topics (name, partitions, internal, created_ms) "
            "VALUES (:n, :c, false, 0)"), {"n": name, "c": len(leaders)})
        for i, node in enumerate(leaders):
            conn.execute(sa.text(
                "INSERT INTO topic_partitions (topic, partition, node_id, created_on_node) "
                "VALUES (:t, :p, :n, false)"), {"t": name, "p": i, "n": node})
    engine.dispose()


# --- the partition reconciler -----------------------------------------------------------


def test_a_partition_its_node_refuses_holds_back_no_other(
    coordinator: Any, fake_nodes: PickyNodes, pg_url: str
) -> None:
    fake_nodes.refuse_create["refused"] = 400
    md = coordinator.services.metadata
    with coordinator.client() as c:
        assert ok(c.post("/v1/topics", json={"name": "refused", "partitions": 2}))
        names = [f"later-{i:02d}" for i in range(20)]
        for name in names:
            made = topic(c, name, 3)
            assert [p["created_on_node"] for p in made["partitions"]] == [True] * 3
        assert created_topics(fake_nodes, "later-") == {(n, p) for n in names for p in range(3)}
        coordinator.call(md.reconcile_once)

        described = ok(c.get("/v1/topics/refused"))
        for p in described["partitions"]:
            assert p["created_on_node"] is False
            assert p["creation_error"].startswith("INVALID_REQUEST (HTTP 400)"), p
        listed = {t["name"]: t for t in ok(c.get("/v1/metadata"))["topics"]}
        assert listed["refused"] == described
        assert all(p["created_on_node"] for p in listed["later-00"]["partitions"])
        assert metric(c, "eos_coordinator_partitions_refused ") == 2
        assert metric(c, "eos_coordinator_partitions_not_created ") == 2
        refusals = sum(metric(c, f'eos_coordinator_partition_creation_refusals_total{{node="{n}"}}')
                       for n in (1, 2))
        assert refusals == 2

        # Not asked again at every round: only rarely, or once the operator acts.
        asked = {tp: n for tp, n in fake_nodes.create_calls.items() if tp[0] == "refused"}
        for _ in range(5):
            assert coordinator.call(md.reconcile_once) == 0
        assert {tp: n for tp, n in fake_nodes.create_calls.items() if tp[0] == "refused"} == asked
        fake_nodes.refuse_create.clear()
        engine = sa.create_engine(pg_url)
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE topic_partitions SET creation_error = NULL "
                                 "WHERE topic = 'refused'"))
        engine.dispose()
        wait_until(lambda: all(p["created_on_node"] for p in
                               ok(c.get("/v1/topics/refused"))["partitions"]),
                   timeout=10, what="the cleared partitions to be created")
        assert ok(c.get("/v1/topics/refused"))["partitions"][0]["creation_error"] is None


def test_an_away_or_busy_node_is_tried_again_and_not_reported_as_refusing(
    coordinator: Any, fake_nodes: PickyNodes
) -> None:
    fake_nodes.down.add(2)
    fake_nodes.refuse_create["busy"] = 503
    with coordinator.client() as c:
        waiting = topic(c, "waiting", 2)
        state = {p["leader"]["node_id"]: (p["created_on_node"], p["creation_error"])
                 for p in waiting["partitions"]}
        assert state == {1: (True, None), 2: (False, None)}
        busy = topic(c, "busy", 2)
        assert [(p["created_on_node"], p["creation_error"]) for p in busy["partitions"]] == [
            (False, None), (False, None)]
        assert topic(c, "after", 2)["partitions"][0]["leader"]["node_id"] in (1, 2)
        coordinator.call(coordinator.services.metadata.reconcile_once)
        assert metric(c, "eos_coordinator_partitions_refused ") == 0
        fake_nodes.down.clear()
        fake_nodes.refuse_create.clear()
        wait_until(lambda: all(p["created_on_node"] for name in ("waiting", "busy", "after")
                               for p in ok(c.get(f"/v1/topics/{name}"))["partitions"]),
                   timeout=10, what="the reconciler to create them once the node is back")


def test_a_topic_is_answered_created_past_a_busy_moment_and_at_once_past_a_down_node(
    coordinator: Any, fake_nodes: PickyNodes
) -> None:
    """A client may produce as soon as the creation is answered: a node that answered 503
    once is asked again before the answer; a node that refuses connections is not waited
    for (the background rounds create its partitions when it is back)."""
    fake_nodes.busy_once.add("blip")
    with coordinator.client() as c:
        blip = topic(c, "blip", 2)
        assert [p["created_on_node"] for p in blip["partitions"]] == [True, True]
        assert all(fake_nodes.create_calls[("blip", p)] == 2 for p in (0, 1))
        fake_nodes.down.add(2)
        started = time.monotonic()
        partly = topic(c, "partly", 2)
        took = time.monotonic() - started
        state = {p["leader"]["node_id"]: p["created_on_node"] for p in partly["partitions"]}
        assert state == {1: True, 2: False}
        assert took < 3, f"the creation waited {took:.1f} s for a node that is down"


def test_a_dot_dot_topic_left_by_an_older_version_is_reported_and_skipped(
    coordinator: Any, fake_nodes: PickyNodes, pg_url: str
) -> None:
    plant_topic(pg_url, "..", [1, 2, 1])
    md = coordinator.services.metadata
    with coordinator.client() as c:
        coordinator.call(md.reconcile_once)
        names = [f"after-{i:02d}" for i in range(20)]
        for name in names:
            topic(c, name, 3)
        wait_until(lambda: len(created_topics(fake_nodes, "after-")) == 60, timeout=10,
                   what="every later partition on its node")
        assert not any(t == ".." for _n, t, _p in fake_nodes.created)
        assert not any(tp[0] == ".." for tp in fake_nodes.create_calls)  # never sent
        listed = {t["name"]: t for t in ok(c.get("/v1/metadata"))["topics"]}
        for p in listed[".."]["partitions"]:
            assert p["created_on_node"] is False
            assert p["creation_error"].startswith("INVALID_REQUEST: '..'"), p
        assert ok(c.get("/v1/topics/%2E%2E")) == listed[".."]
        # the gauge is set at the end of each full round: a background round that began
        # before the refusal was recorded may end after the one that recorded it
        wait_until(lambda: metric(c, "eos_coordinator_partitions_refused ") == 3,
                   timeout=10, what="the refused partitions counted")  # fmt: skip


# --- the marker channel -----------------------------------------------------------------


def test_a_marker_its_node_refuses_holds_back_no_other_marker(
    coordinator: Any, fake_nodes: PickyNodes
) -> None:
    fake_nodes.refuse_markers.add("poison")
    with coordinator.client(timeout=15) as c:
        topic(c, "orders", 4)
        topic(c, "poison", 2)
        pid, epoch = init(c, "stuck")
        ok(add(c, "stuck", pid, epoch, 0, 1, topic="poison"))
        ok(add(c, "stuck", pid, epoch, 0))
        assert ok(end(c, "stuck", pid, epoch, wait=False))["state"] == "PrepareCommit"
        for i in range(5):
            tid = f"healthy-{i}"
            pid_i, epoch_i = init(c, tid)
            ok(add(c, tid, pid_i, epoch_i, 0, 1, 2, 3))
            assert ok(end(c, tid, pid_i, epoch_i))["state"] == "CompleteCommit"
        wait_until(lambda: describe(c, "stuck")["state"] == "CompleteCommit", timeout=10,
                   what="the transaction with the refused partitions to complete")
        delivered = {(tp["topic"], tp["partition"]) for _n, m in fake_nodes.markers_for(pid)
                     for tp in m["partitions"]}
        assert delivered == {("orders", 0)}
        assert fake_nodes.refused_marker_requests >= 2
        assert metric(c, "eos_coordinator_markers_refused_total ") == 2
        assert metric(c, "eos_coordinator_marker_queue_depth ") == 0


def test_a_partition_that_keeps_answering_retriable_does_not_slow_its_node(
    coordinator_factory: Any, fake_nodes: PickyNodes
) -> None:
    coordinator = coordinator_factory(marker_backoff_max_ms=10_000)
    with coordinator.client(timeout=30) as c:
        placed = topic(c, "orders", 4)
        on_node = [p["partition"] for p in placed["partitions"] if p["leader"]["node_id"] == 1]
        stuck_part, other_part = on_node[0], on_node[1]
        fake_nodes.not_leader.add(("orders", stuck_part))
        pid, epoch = init(c, "stuck")
        ok(add(c, "stuck", pid, epoch, stuck_part))
        ok(end(c, "stuck", pid, epoch, wait=False))
        wait_until(lambda: len(fake_nodes.markers_for(pid)) >= 6, timeout=15,
                   what="several refused tries of the stuck partition")
        for i in range(5):
            tid = f"quick-{i}"
            pid_i, epoch_i = init(c, tid)
            ok(add(c, tid, pid_i, epoch_i, other_part))
            started = time.monotonic()
            assert ok(end(c, tid, pid_i, epoch_i))["state"] == "CompleteCommit"
            # well under the 10 s backoff, with room for a loaded machine
            assert time.monotonic() - started < 5.0, "a marker waited for the node's backoff"
        assert describe(c, "stuck")["state"] == "PrepareCommit"
        fake_nodes.not_leader.clear()
        wait_until(lambda: describe(c, "stuck")["state"] == "CompleteCommit", timeout=15,
                   what="the stuck partition to take its marker once it can")


def test_an_away_node_and_an_unknown_node_hold_back_only_their_own_markers(
    coordinator: Any, fake_nodes: PickyNodes, pg_url: str
) -> None:
    plant_topic(pg_url, "ghost", [9])  # led by a node this coordinator was not given
    with coordinator.client(timeout=15) as c:
        placed = topic(c, "orders", 4)
        leader = {p["partition"]: p["leader"]["node_id"] for p in placed["partitions"]}
        on1 = [p for p, n in leader.items() if n == 1]
        on2 = [p for p, n in leader.items() if n == 2]
        pid, epoch = init(c, "far")
        ok(add(c, "far", pid, epoch, 0, topic="ghost"))
        ok(add(c, "far", pid, epoch, on1[0]))
        assert ok(end(c, "far", pid, epoch, wait=False))["state"] == "PrepareCommit"
        fake_nodes.down.add(2)
        pid2, epoch2 = init(c, "away")
        ok(add(c, "away", pid2, epoch2, on2[0], on1[1]))
        assert ok(end(c, "away", pid2, epoch2, wait=False))["state"] == "PrepareCommit"
        for i in range(3):
            tid = f"near-{i}"
            pid_i, epoch_i = init(c, tid)
            ok(add(c, tid, pid_i, epoch_i, *on1))
            assert ok(end(c, tid, pid_i, epoch_i))["state"] == "CompleteCommit"
        assert describe(c, "away")["state"] == "PrepareCommit"
        fake_nodes.down.clear()
        wait_until(lambda: describe(c, "away")["state"] == "CompleteCommit", timeout=15,
                   what="the away node's markers once it is back")
        assert describe(c, "far")["state"] == "PrepareCommit"  # node 9 never answers
        assert metric(c, 'eos_coordinator_background_entries_set_aside_total{loop="markers"}') >= 1
