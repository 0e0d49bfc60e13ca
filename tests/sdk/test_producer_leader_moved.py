"""A produce attempt held by a silent leader (paused, or cut off while its connection
stays open) is given up as soon as the partition is led elsewhere, and the batch goes to
the new leader with the same sequence numbers, instead of waiting out the request timeout.

The old leader is a handler that never answers until the test ends; the coordinator names
it as the leader until it has been sent the batch, then names another node (an election).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from sdk import Producer, RetryConfig
from sdk.aio import AsyncProducer

pytestmark = pytest.mark.unit

URL = "http://coordinator"
OLD, NEW = "http://old-leader", "http://new-leader"
#: Far beyond what the test waits: only giving the attempt up ends it in time.
RETRY = RetryConfig(backoff_ms=10, backoff_max_ms=50, request_timeout_ms=60_000)


class Cluster:
    """The coordinator and both leaders, behind one mock transport."""

    def __init__(self) -> None:
        self.held = threading.Event()  # the old leader got the batch (and sits on it)
        self.release = threading.Event()  # set at the end: the held attempt may end
        self.sent_to_new: list[dict[str, Any]] = []

    def topic(self) -> dict[str, Any]:
        url = NEW if self.held.is_set() else OLD
        return {"name": "t", "partitions": [{"partition": 0, "leader": {"node_id": 1, "url": url}}]}

    def answer(self, request: httpx.Request) -> httpx.Response:
        host, path = f"http://{request.url.host}", request.url.path
        if host == URL and path == "/v1/metadata":
            return httpx.Response(200, json={"cluster_id": "c", "nodes": [], "topics": []})
        if host == URL and path == "/v1/topics/t":
            return httpx.Response(200, json=self.topic())
        if host == URL and path == "/v1/producers":
            return httpx.Response(200, json={"producer_id": 7, "producer_epoch": 0})
        if host == OLD:
            self.held.set()
            self.release.wait(30)
            return httpx.Response(503, json={"error": {"code": "NOT_LEADER_OR_FOLLOWER",
                                                       "message": "no longer"}})  # fmt: skip
        if host == NEW:
            self.sent_to_new.append(httpx.Response(200, content=request.content).json())
            return httpx.Response(200, json={"base_offset": 41, "log_append_time_ms": 1})
        return httpx.Response(404, json={"error": {"code": "NOT_FOUND", "message": path}})

    async def answer_async(self, request: httpx.Request) -> httpx.Response:
        if f"http://{request.url.host}" == OLD:
            self.held.set()
            await asyncio.to_thread(self.release.wait, 30)
        return self.answer(request)


def test_a_batch_held_by_a_silent_leader_goes_to_the_new_one() -> None:
    cluster = Cluster()
    transport = httpx.MockTransport(cluster.answer)
    started = time.monotonic()
    try:
        with Producer(URL, retry=RETRY, transport=transport, linger_ms=0) as producer:
            metadata = producer.send("t", "v", partition=0).result(timeout=20)
    finally:
        cluster.release.set()
    assert cluster.held.is_set(), "the old leader never got the batch"
    assert metadata.offset == 41
    assert time.monotonic() - started < 20
    # the same batch, with the sequence it had: a copy that landed would be a duplicate
    assert [body.get("base_sequence") for body in cluster.sent_to_new] == [0]


def test_the_async_producer_gives_the_silent_leader_up_too() -> None:
    cluster = Cluster()

    async def main() -> int:
        transport = httpx.MockTransport(cluster.answer_async)
        async with AsyncProducer(URL, retry=RETRY, transport=transport, linger_ms=0) as producer:
            future = await producer.send("t", "v", partition=0)
            try:
                metadata = await asyncio.wait_for(future, timeout=20)
            finally:
                cluster.release.set()  # before the loop waits for its threads at the end
            return metadata.offset

    try:
        offset = asyncio.run(main())
    finally:
        cluster.release.set()
    assert offset == 41
    assert [body.get("base_sequence") for body in cluster.sent_to_new] == [0]
