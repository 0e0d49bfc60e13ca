"""A reconciler round whose read of the pending partitions began before another round
recorded its answers reads them again, rather than asking the nodes for partitions they
have just created.

A topic's creation runs its own rounds while the background round goes on. A background
round that read the pending rows before the creation's round recorded them, and claimed
them after that round had dropped its claims, asked every node for the whole topic a
second time: on a loaded machine a thousand-partition topic was created twice over (the
node counted four batches of 500 where two were sent for it). The database here is a fake
that holds one read until the test lets it end, so the two rounds meet in that order every
time; the nodes are an httpx transport."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest

from coordinator_service.controller.partition_state import PartitionKey
from coordinator_service.controller.reconciler import (
    Placed,
    Reconciler,
    pending_rows,
    record_attempts,
)
from coordinator_service.metrics import CoordinatorMetrics

pytestmark = pytest.mark.unit

NODES = (1, 2, 3)
PARTITIONS = 20


class HeldReads:
    """``Database.run`` over a dict of partitions: ``pending_rows`` returns what was
    pending when the read began, after the next gate in ``gates`` opens (if any);
    ``record_attempts`` stores the created replicas."""

    def __init__(self) -> None:
        self.created: dict[PartitionKey, set[int]] = {
            ("big", p): set() for p in range(PARTITIONS)
        }
        self.gates: list[asyncio.Event] = []
        self.reads = 0

    async def run(self, fn: Any, *args: Any) -> Any:
        if fn is pending_rows:
            self.reads += 1
            rows = [Placed(t, p, NODES, frozenset(have), None)
                    for (t, p), have in self.created.items() if len(have) < len(NODES)]  # fmt: skip
            if self.gates:
                await self.gates.pop(0).wait()
            return rows
        assert fn is record_attempts, fn
        created, _refused = args
        complete = set()
        for key, nodes in created.items():
            self.created[key] |= nodes
            if len(self.created[key]) == len(NODES):
                complete.add(key)
        return complete


async def until(condition: Any) -> None:
    for _ in range(1_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the rounds never reached the expected point")


def test_a_round_that_read_before_another_recorded_reads_again() -> None:
    async def scenario() -> tuple[Counter[int], int]:
        db = HeldReads()
        batches: Counter[int] = Counter()
        nodes_answer = asyncio.Event()

        async def node(request: httpx.Request) -> httpx.Response:
            batches[int(request.url.host.removeprefix("node"))] += 1
            await nodes_answer.wait()
            entries = orjson.loads(request.content)["partitions"]
            return httpx.Response(200, json={"partitions": [
                {"topic": e["topic"], "partition": e["partition"], "created": True,
                 "error": None} for e in entries
            ]})  # fmt: skip

        async with httpx.AsyncClient(transport=httpx.MockTransport(node)) as client:
            reconciler = Reconciler(
                db, nodes={n: f"http://node{n}" for n in NODES}, client=client,  # type: ignore[arg-type]
                internal_token=None, interval_ms=100, metrics=CoordinatorMetrics(),
                on_state=lambda *_: None,
            )
            creation = asyncio.create_task(reconciler.reconcile_once("big"))
            await until(lambda: sum(batches.values()) == len(NODES))  # its batches are out
            held = asyncio.Event()
            db.gates.append(held)
            background = asyncio.create_task(reconciler.reconcile_once())
            await until(lambda: db.reads == 2)  # its read began before the record
            nodes_answer.set()
            assert await creation == 0
            assert not reconciler.in_flight  # the creation's claims are gone
            held.set()
            assert await background == 0
        return batches, db.reads

    batches, reads = asyncio.run(scenario())
    assert batches == Counter(dict.fromkeys(NODES, 1)), "a node was asked twice"
    assert reads == 3  # the background round's second read found nothing pending
