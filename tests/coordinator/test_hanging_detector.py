"""One bad entry must not stop the hanging-transaction detector.

The coordinator and its PostgreSQL database are real; the three storage nodes are
``FakeNodes`` behind an httpx transport that also answer ``GET
/internal/v1/open-transactions`` with what each test plants. Node 2 is down, node 3
answers a body that is not JSON, node 1 reports a transaction on a partition whose
leader is another node (a leader that moved and has not heard yet) and two hanging
transactions of its own, the marker of the first of which it refuses: the pass must go
on, report what it could read and abort what it can, and count what it set aside.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.coordinator.conftest import CoordinatorFactory
from tests.coordinator.helpers import leaders, topic
from tests.support.coordinators import FakeNodes

OPEN = "/internal/v1/open-transactions"


class HangingNodes(FakeNodes):
    """``FakeNodes`` whose open transactions are what ``open`` holds per node; a marker
    closes the producer's open transaction there, unless its producer id is in
    ``refuse_markers`` (answered KAFKA_STORAGE_ERROR for the partition)."""

    def __init__(self) -> None:
        super().__init__((1, 2, 3))
        self.open: dict[int, list[dict[str, Any]]] = {1: [], 2: [], 3: []}
        self.garbage: set[int] = set()
        self.refuse_markers: set[int] = set()

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        if node in self.down:
            return super()._handle(request)
        if request.url.path == OPEN:
            if node in self.garbage:
                return httpx.Response(200, content=b"<html>not a node</html>")
            return httpx.Response(200, json={"node_id": node, "now_ms": 0,
                                             "open_transactions": self.open[node]})
        if request.url.path == "/internal/v1/markers":
            marker = orjson.loads(request.content)["markers"][0]
            tp = marker["partitions"][0]
            if marker["producer_id"] in self.refuse_markers:
                self.markers.append((node, marker))
                return httpx.Response(200, json={"results": [
                    {"producer_id": marker["producer_id"], "topic": tp["topic"],
                     "partition": tp["partition"], "error": "KAFKA_STORAGE_ERROR"}]})
            self.open[node] = [t for t in self.open[node]
                               if (t["producer_id"], t["partition"])
                               != (marker["producer_id"], tp["partition"])]
        return super()._handle(request)


@pytest.fixture
def fake_nodes() -> FakeNodes:
    return HangingNodes()


def planted(pid: int, partition: int, epoch: int = 2) -> dict[str, Any]:
    return {"topic": "orders", "partition": partition, "producer_id": pid,
            "producer_epoch": epoch, "coordinator_epoch": -1, "first_offset": 5,
            "age_ms": 60_000}


def set_aside(services: Any) -> float:
    value = services.metrics.set_aside.labels(loop="hanging")._value.get()
    return float(value)


def test_a_pass_survives_a_node_down_an_unreadable_answer_and_a_moved_leader(
    coordinator_factory: CoordinatorFactory, fake_nodes: HangingNodes
) -> None:
    coordinator = coordinator_factory(background=False, abort_hanging_after_ms=1_000)
    services = coordinator.services
    with coordinator.client() as client:
        topic(client, "orders", partitions=6)
    led = leaders(coordinator.url, "orders")
    on_1 = [p for p, n in led.items() if n == 1]
    elsewhere = next(p for p, n in led.items() if n != 1)
    assert len(on_1) >= 2, led
    fake_nodes.open[1] = [planted(7_000_001, on_1[0]), planted(7_000_002, on_1[1]),
                          planted(7_000_003, elsewhere)]  # fmt: skip
    fake_nodes.down.add(2)
    fake_nodes.garbage.add(3)
    fake_nodes.refuse_markers.add(7_000_001)
    assert coordinator.call(services.controller.hold_lease)
    before = set_aside(services)

    found = coordinator.call(services.hanging.run_once)

    assert sorted(found.failed_nodes) == [2, 3]
    assert sorted(f.txn.producer_id for f in found.findings) == [7_000_001, 7_000_002]
    assert found.open_on_nodes == 2  # the moved leader's report is not counted
    aborts = [(n, m["producer_id"], m["producer_epoch"], m["result"])
              for n, m in fake_nodes.markers]  # fmt: skip
    assert (1, 7_000_002, 3, "ABORT") in aborts  # aborted although the first was refused
    assert (1, 7_000_001, 3, "ABORT") in aborts
    assert all(pid != 7_000_003 for _, pid, _, _ in aborts)
    # node 2 down, node 3 unreadable, the refused marker: each set aside, none fatal
    assert set_aside(services) - before == 3
    assert services.metrics.hanging_transactions._value.get() == 2
    resolved = services.metrics.hanging_resolved.labels(action="abort")._value.get()
    assert resolved == 1

    listed = httpx.get(f"{coordinator.url}/v1/admin/hanging-transactions", timeout=30).json()
    assert [h["producer_id"] for h in listed["hanging"]] == [7_000_001]


def test_report_only_changes_nothing(
    coordinator_factory: CoordinatorFactory, fake_nodes: HangingNodes
) -> None:
    coordinator = coordinator_factory(background=False)
    services = coordinator.services
    with coordinator.client() as client:
        topic(client, "orders", partitions=3)
    partition = next(p for p, n in leaders(coordinator.url, "orders").items() if n == 1)
    fake_nodes.open[1] = [planted(7_000_009, partition)]
    assert coordinator.call(services.controller.hold_lease)

    found = coordinator.call(services.hanging.run_once)

    assert [f.txn.producer_id for f in found.findings] == [7_000_009]
    assert fake_nodes.markers == []
    assert services.metrics.hanging_transactions._value.get() == 1
