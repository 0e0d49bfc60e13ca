"""The coordinator's batched calls to the storage nodes: partitions created in a few
requests per node (``POST /internal/v1/partitions``) and partition states pushed in one
request per node (``PUT /internal/v1/partition-states``), and the fall back to one request
per partition for a node of an older version, which answers 404 or 405 to both.

The nodes are ``FakeNodes`` behind an httpx transport that also serve the batches (node
ids in ``old`` answer as the previous release does); the coordinator and its PostgreSQL
are real. ``StatePusher`` and ``judge_batch`` are also tested on their own.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from coordinator_service.clock import FakeClock
from coordinator_service.controller.partition_state import StoredPartition
from coordinator_service.controller.reconciler import Attempt, Placed, Unbatched, judge_batch
from coordinator_service.controller.state_push import StatePusher
from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import ok
from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes, InProcessCoordinator
from tests.support.processes import wait_until

CREATE = "/internal/v1/partitions"
STATES = "/internal/v1/partition-states"


def envelope(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": f"HTTP {status}",
                                                  "retriable": status == 503}})  # fmt: skip


class BatchNodes(FakeNodes):
    """``FakeNodes`` of this version: they also create partitions and take states in
    batches. Nodes in ``old`` answer the batches as a version without them; a topic of
    ``refuse`` is refused entry by entry; a node's status in ``whole`` answers every
    batched creation with that status."""

    def __init__(self) -> None:
        super().__init__((1, 2, 3))
        self.old: set[int] = set()
        self.refuse: set[str] = set()
        self.whole: dict[int, int] = {}
        self.calls: Counter[tuple[int, str]] = Counter()  # (node, kind)
        # (node, topic): batched creations that named the topic. The offsets topic's
        # partitions are created at the coordinator's start, and on a loaded machine that
        # may still go on while a test counts its own topic's requests
        self.batches: Counter[tuple[int, str]] = Counter()
        self.pushes: Counter[tuple[int, str]] = Counter()  # (node, topic): batched pushes
        self.single_creates: Counter[tuple[int, str]] = Counter()  # (node, topic)
        # batched creations a node in ``old`` answered 405, whichever topics they named
        # (the offsets topic's, made at the start, may be the one that meets it first)
        self.refused_as_old: Counter[int] = Counter()
        self.states: dict[tuple[int, str, int], dict[str, Any]] = {}
        self.pushed_singly: Counter[tuple[int, str]] = Counter()  # (node, topic)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        path, method = request.url.path, request.method
        authorized = request.headers.get("authorization") == f"Bearer {INTERNAL_TOKEN}"
        if node in self.down or not authorized:
            return super()._handle(request)
        if method == "POST" and path == CREATE:
            self.calls[(node, "create-batch")] += 1
            topics = {e["topic"] for e in orjson.loads(request.content)["partitions"]}
            self.batches.update((node, topic) for topic in topics)
            if node in self.old:
                self.refused_as_old[node] += 1
                return envelope(405, "INVALID_REQUEST")
            if node in self.whole:
                return envelope(self.whole[node], "INVALID_REQUEST")
            return httpx.Response(200, json={"partitions": [
                self._create(node, e) for e in orjson.loads(request.content)["partitions"]
            ]})  # fmt: skip
        if method == "PUT" and path == STATES:
            self.calls[(node, "push-batch")] += 1
            topics = {e["topic"] for e in orjson.loads(request.content)["states"]}
            self.pushes.update((node, topic) for topic in topics)
            if node in self.old:
                return envelope(404, "NOT_FOUND")
            answers = []
            for s in orjson.loads(request.content)["states"]:
                self.states[(node, s["topic"], s["partition"])] = s
                answers.append({"topic": s["topic"], "partition": s["partition"],
                                "applied": True})  # fmt: skip
            return httpx.Response(200, json={"states": answers})
        if method == "PUT" and path.endswith("/state"):
            _, _, _, _, topic, partition, _ = path.split("/")
            self.pushed_singly[(node, topic)] += 1
            self.states[(node, topic, int(partition))] = orjson.loads(request.content)
            return httpx.Response(200, json={"applied": True})
        if method == "PUT" and path.startswith(CREATE + "/"):
            self.single_creates[(node, path.split("/")[4])] += 1
        return super()._handle(request)

    def _create(self, node: int, entry: dict[str, Any]) -> dict[str, Any]:
        topic, partition = entry["topic"], entry["partition"]
        answer: dict[str, Any] = {"topic": topic, "partition": partition, "created": False,
                                  "error": None}  # fmt: skip
        if topic in self.refuse:
            answer["error"] = {"code": "INVALID_REQUEST", "message": f"not holding {topic}"}
            return answer
        with self._lock:
            answer["created"] = (node, topic, partition) not in self.created
            self.created.add((node, topic, partition))
        return answer


@pytest.fixture
def fake_nodes() -> BatchNodes:
    return BatchNodes()


@pytest.fixture
def coordinator(coordinator_factory: CoordinatorFactory) -> InProcessCoordinator:
    # a batch of 500 partitions answered by the fake nodes of a loaded machine may take
    # longer than the 5 s default; a node taken for away would be asked again later, and
    # these tests count the requests of one round
    return coordinator_factory(lease_clock=FakeClock(), background=False,
                               node_session_timeout_ms=2_000, node_timeout_ms=60_000)  # fmt: skip


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[httpx.Client]:
    with coordinator.client(timeout=60) as c:
        yield c


def create(client: httpx.Client, name: str, partitions: int, rf: int = 1) -> list[dict[str, Any]]:
    body = {"name": name, "partitions": partitions, "replication_factor": rf}
    return list(ok(client.post("/v1/topics", json=body))["partitions"])


def test_a_thousand_partitions_are_created_in_batches_and_singly_on_an_older_node(
    client: httpx.Client, fake_nodes: BatchNodes
) -> None:
    fake_nodes.old.add(3)
    made = create(client, "big", 1000, rf=3)
    batches = fake_nodes.batches
    assert all(p["created_on_node"] for p in made)
    assert {(n, t, p) for n, t, p in fake_nodes.created if t == "big"} == {
        (n, "big", p) for p in range(1000) for n in (1, 2, 3)
    }
    for node in (1, 2):
        assert fake_nodes.single_creates[(node, "big")] == 0
        assert batches[(node, "big")] == 2  # 500 a request
    assert fake_nodes.single_creates[(3, "big")] == 1000
    assert fake_nodes.refused_as_old[3] == 1  # its 405 is remembered

    # every replica learnt every first state before the creation was answered: nodes of
    # this version in one request, the older one a request per partition
    for node in (1, 2, 3):
        held = {p for n, t, p in fake_nodes.states if (n, t) == (node, "big")}
        assert held == set(range(1000))
    for node in (1, 2):
        assert (fake_nodes.pushes[(node, "big")], fake_nodes.pushed_singly[(node, "big")]) == (1, 0)
    assert fake_nodes.pushes[(3, "big")] == 1
    assert fake_nodes.pushed_singly[(3, "big")] == 1000
    state = fake_nodes.states[(1, "big", 0)]
    assert (state["replicas"], state["isr"], state["partition_epoch"]) == (
        made[0]["replicas"], made[0]["replicas"], 0
    )


def test_an_entry_the_node_refuses_is_that_partition_s_refusal_alone(
    coordinator: InProcessCoordinator, client: httpx.Client, fake_nodes: BatchNodes
) -> None:
    fake_nodes.refuse.add("refused")
    create(client, "refused", 3)
    fine = create(client, "fine", 3)
    assert all(p["created_on_node"] for p in fine)
    coordinator.call(coordinator.services.metadata.reconcile_once)
    for p in ok(client.get("/v1/topics/refused"))["partitions"]:
        assert p["created_on_node"] is False
        assert p["creation_error"] == "INVALID_REQUEST: not holding refused", p
    assert not any(n for n in fake_nodes.single_creates.values())


def test_a_node_busy_for_a_batch_is_away_and_one_refusing_the_batch_is_asked_singly(
    coordinator: InProcessCoordinator, client: httpx.Client, fake_nodes: BatchNodes
) -> None:
    """503 to the whole batch: the node is away, its partitions wait for a later round
    and no partition is asked on its own. 413 to the whole batch: each partition of it is
    asked on its own at once, and the next batch is tried again."""
    fake_nodes.whole[2] = 503
    made = create(client, "later", 6)
    assert [p["created_on_node"] for p in made] == [p["leader"]["node_id"] != 2 for p in made]
    assert fake_nodes.single_creates[(2, "later")] == 0
    del fake_nodes.whole[2]

    def a_later_round_made_them() -> bool:
        # a round may find the creation's own attempt still in flight on a loaded
        # machine, and leave those partitions to the next round, as the reconciler does
        coordinator.call(coordinator.services.metadata.reconcile_once)
        partitions = ok(client.get("/v1/topics/later"))["partitions"]
        return all(p["created_on_node"] for p in partitions)

    wait_until(a_later_round_made_them, timeout=60, what="a later round to create them")
    assert fake_nodes.single_creates[(2, "later")] == 0  # asked in a batch, not singly

    fake_nodes.whole[2] = 413
    made = create(client, "big-request", 6)
    assert all(p["created_on_node"] for p in made)
    assert fake_nodes.single_creates[(2, "big-request")] == 2
    del fake_nodes.whole[2]
    assert all(p["created_on_node"] for p in create(client, "after", 6))
    assert fake_nodes.batches[(2, "after")] == 1  # batched again
    assert fake_nodes.single_creates[(2, "after")] == 0


# --- judge_batch and StatePusher on their own ---------------------------------------------


ROWS = [Placed("t", p, (1, 2), frozenset(), None) for p in range(3)]


@pytest.mark.unit
def test_judge_batch_reads_each_entry_and_tells_away_from_unbatched() -> None:
    answer = {"partitions": [
        {"topic": "t", "partition": 2, "created": False, "error": None},
        {"topic": "t", "partition": 0, "created": True, "error": None, "later_field": 1},
        {"topic": "t", "partition": 1, "created": False,
         "error": {"code": "INVALID_REQUEST", "message": "no"}},
    ]}  # fmt: skip
    assert judge_batch(200, orjson.dumps(answer), ROWS) == [
        Attempt(created=True), Attempt(refusal="INVALID_REQUEST: no"), Attempt(created=True)
    ]
    partial = {"partitions": answer["partitions"][:1]}
    assert judge_batch(200, orjson.dumps(partial), ROWS)[:2] == [Attempt(), Attempt()]
    for status in (404, 405):
        assert judge_batch(status, b"", ROWS) == Unbatched(f"HTTP {status}", remember=True)
    for status in (401, 403, 408, 425, 429, 500, 503):
        verdict = judge_batch(status, orjson.dumps({"error": {"code": "X", "message": "m",
                                                              "retriable": True}}), ROWS)
        assert isinstance(verdict, Attempt) and verdict.away == f"HTTP {status}"
    assert isinstance(judge_batch(200, b"<html>", ROWS), Attempt)
    refused = judge_batch(413, envelope(413, "MESSAGE_TOO_LARGE").content, ROWS)
    assert isinstance(refused, Unbatched) and not refused.remember
    assert refused.reason.startswith("MESSAGE_TOO_LARGE (HTTP 413)")


def stored(partition: int, epoch: int, replicas: tuple[int, ...] = (1, 2)) -> StoredPartition:
    return StoredPartition("t", partition, replicas[0], epoch, epoch, replicas, replicas, 2)


class ScriptedNodes:
    """Nodes behind an async ``MockTransport`` that record every request; node 2 holds
    its answers while ``hold`` is clear; nodes in ``old`` answer 404 to the batch."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str, Any]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.held = asyncio.Event()  # a request to node 2 has arrived
        self.old: set[int] = set()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node"))
        body = orjson.loads(request.content)
        self.requests.append((node, request.url.path, body))
        if node == 2:
            self.held.set()
            await self.hold.wait()
        if request.url.path == STATES:
            if node in self.old:
                return envelope(404, "NOT_FOUND")
            return httpx.Response(200, json={"states": [
                {"topic": s["topic"], "partition": s["partition"], "applied": True}
                for s in body["states"]]})  # fmt: skip
        return httpx.Response(200, json={"applied": True})

    def batches(self, node: int) -> list[list[tuple[int, int]]]:
        return [[(s["partition"], s["partition_epoch"]) for s in body["states"]]
                for n, path, body in self.requests if n == node and path == STATES]  # fmt: skip


def run_pusher(scenario: Any) -> ScriptedNodes:
    nodes = ScriptedNodes()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(nodes.handle)) as client:
            pusher = StatePusher(client, nodes={n: f"http://node{n}" for n in (1, 2, 3)},
                                 internal_token="t")  # fmt: skip
            try:
                await scenario(pusher, nodes)
            finally:
                await pusher.stop()

    asyncio.run(run())
    return nodes


@pytest.mark.unit
def test_states_pushed_in_one_turn_leave_in_one_request_per_node() -> None:
    async def scenario(pusher: StatePusher, nodes: ScriptedNodes) -> None:
        for p in range(3):
            pusher.push(stored(p, 1))
        pusher.push(stored(3, 1, replicas=(3, 1)))
        await pusher.settle()

    nodes = run_pusher(scenario)
    assert nodes.batches(1) == [[(0, 1), (1, 1), (2, 1), (3, 1)]]
    assert nodes.batches(2) == [[(0, 1), (1, 1), (2, 1)]]
    assert nodes.batches(3) == [[(3, 1)]]
    (_, _, body), *_ = nodes.requests
    assert body["nodes"] == {str(n): f"http://node{n}" for n in (1, 2, 3)}


@pytest.mark.unit
def test_states_pushed_while_a_request_is_in_flight_gather_the_latest_wins() -> None:
    async def scenario(pusher: StatePusher, nodes: ScriptedNodes) -> None:
        nodes.hold.clear()
        pusher.push(stored(0, 1))
        await asyncio.wait_for(nodes.held.wait(), 5)  # it left at once, without a timer
        pusher.push(stored(0, 3))
        pusher.push(stored(1, 2))
        pusher.push(stored(0, 2))  # older than the one waiting: it does not replace it
        await asyncio.sleep(0.01)  # time enough for a request that should not be sent
        assert nodes.batches(2) == [[(0, 1)]]  # the next waits for the answer
        nodes.hold.set()
        await pusher.settle()

    nodes = run_pusher(scenario)
    assert nodes.batches(2) == [[(0, 1)], [(0, 3), (1, 2)]]
    assert nodes.batches(1) == [[(0, 1)], [(0, 3), (1, 2)]]


@pytest.mark.unit
def test_a_node_without_the_batch_is_sent_each_state_and_remembered() -> None:
    async def scenario(pusher: StatePusher, nodes: ScriptedNodes) -> None:
        nodes.old.add(2)
        await pusher.deliver([stored(0, 0), stored(1, 0)])
        pusher.push(stored(0, 1))
        await pusher.settle()

    nodes = run_pusher(scenario)
    to_2 = [(path, body.get("partition_epoch")) for n, path, body in nodes.requests if n == 2]
    assert to_2 == [(STATES, None), (f"{CREATE}/t/0/state", 0), (f"{CREATE}/t/1/state", 0),
                    (f"{CREATE}/t/0/state", 1)]  # fmt: skip
    assert nodes.batches(1) == [[(0, 0), (1, 0)], [(0, 1)]]
