"""A node's heartbeat or ISR change (``CoordinatorPool.post``) is hedged as its reads are:
an instance that holds the request (one cut from its database waits on it) costs the
hedge delay, not the node's whole coordinator timeout. Sent to it alone, a heartbeat came
after the controller's session timeout and the healthy node was taken for dead (the
Jepsen-style runs, fault ``pg-cut``)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from partition_service.coordinators import CoordinatorPool

pytestmark = pytest.mark.unit

A, B = "http://a.test", "http://b.test"
PATH = "/internal/v1/nodes/3/heartbeat"
TIMEOUT_S = 5.0


def test_a_heartbeat_held_by_one_instance_is_answered_by_the_next() -> None:
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            # cut from its database: holds the write until the client gives up on it
            try:
                await asyncio.wait_for(release.wait(), TIMEOUT_S)
            except TimeoutError:
                raise httpx.ReadTimeout("no answer", request=request) from None
        return httpx.Response(200, json={"host": request.url.host})

    async def check() -> tuple[int, bytes, float]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler), timeout=TIMEOUT_S)
        pool = CoordinatorPool([A, B], "t" * 32, timeout_s=TIMEOUT_S, client=client)
        try:
            started = time.monotonic()
            status, content = await pool.post(PATH, {"node_id": 3})
            took = time.monotonic() - started
        finally:
            release.set()
            await pool.close()
        return status, content, took

    status, content, took = asyncio.run(check())
    assert status == 200 and b"b.test" in content
    # the node's coordinator timeout is 5 s; the hedge delay a fraction of one
    assert took < TIMEOUT_S / 2, f"answered after {took:.2f} s"
