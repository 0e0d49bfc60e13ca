"""The node's one write to the coordinators (``CoordinatorPool.post_to_owner``, the add of
transaction version 2) against scripted instances behind ``httpx.MockTransport``: it
follows NOT_COORDINATOR to the owner, does not hold that answer against the instance,
gives a set-aside owner only the hedge delay, never asks an instance twice in one call
after it failed, and hands back the answers of instances that served."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx
import pytest

from eos_protocol.errors import CoordinatorNotAvailableError
from partition_service.coordinators import CoordinatorPool

pytestmark = pytest.mark.unit

A, B = "http://a.test", "http://b.test"
PATH = "/internal/v1/producers/7/partitions"
BODY = {"producer_epoch": 0, "topic": "t", "partition": 0}
OK = {"producer_id": 7}

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def envelope(status: int, code: str, **details: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {
        "code": code, "message": code, "retriable": status == 503, "details": details}})


def pool_of(handler: Handler, timeout_s: float = 2.0) -> tuple[CoordinatorPool, Counter[str]]:
    asked: Counter[str] = Counter()

    async def count(request: httpx.Request) -> httpx.Response:
        asked[f"{request.url.scheme}://{request.url.host}"] += 1
        return await handler(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(count), timeout=timeout_s)
    return CoordinatorPool([A], "t" * 32, timeout_s=timeout_s, client=client), asked


def test_not_coordinator_is_followed_to_the_owner() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            return envelope(503, "NOT_COORDINATOR", coordinator_url=B + "/")
        return httpx.Response(200, json=OK)

    async def check() -> None:
        pool, asked = pool_of(handler)
        try:
            status, _body, owner = await pool.post_to_owner(PATH, BODY)
            assert (status, owner) == (200, B) and asked == Counter({A: 1, B: 1})
            assert not pool._is_aside(A)  # it served: a redirect is no failure
            # the caller remembers the owner: next time it goes there at once
            await pool.post_to_owner(PATH, BODY, first=B)
            assert asked == Counter({A: 1, B: 2})
        finally:
            await pool.close()

    asyncio.run(check())


def test_served_refusals_are_handed_back() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return envelope(503, "CONCURRENT_TRANSACTIONS")

    async def check() -> None:
        pool, _asked = pool_of(handler)
        try:
            status, body, owner = await pool.post_to_owner(PATH, BODY)
            assert (status, owner) == (503, A) and b"CONCURRENT_TRANSACTIONS" in body
            assert not pool._is_aside(A)
        finally:
            await pool.close()

    asyncio.run(check())


def test_an_unreachable_owner_is_asked_once_then_only_briefly() -> None:
    state = {"owner": "refuses"}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            return envelope(503, "NOT_COORDINATOR", coordinator_url=B)
        if state["owner"] == "refuses":
            raise httpx.ConnectError("refused", request=request)
        await asyncio.sleep(30)  # paused: holds the request
        return httpx.Response(200, json=OK)

    async def check() -> None:
        pool, asked = pool_of(handler)
        try:
            with pytest.raises(CoordinatorNotAvailableError, match="not the owner"):
                await pool.post_to_owner(PATH, BODY)
            assert asked[B] == 1 and pool._is_aside(B) and not pool._is_aside(A)
            # set aside, and now silent: the owner named again gets the hedge delay only,
            # and a ``first`` that is set aside is not asked first
            state["owner"] = "silent"
            started = time.monotonic()
            with pytest.raises(CoordinatorNotAvailableError):
                await pool.post_to_owner(PATH, BODY, first=B)
            assert time.monotonic() - started < 1.5  # not the 2 s timeout
            assert asked == Counter({A: 2, B: 2})
        finally:
            await pool.close()

    asyncio.run(check())


def test_redirects_are_bounded() -> None:
    """Two instances that each name the other (a lease moving back and forth)."""
    async def handler(request: httpx.Request) -> httpx.Response:
        other = B if request.url.host == "a.test" else A
        return envelope(503, "NOT_COORDINATOR", coordinator_url=other)

    async def check() -> None:
        pool, asked = pool_of(handler)
        try:
            status, body, _owner = await pool.post_to_owner(PATH, BODY)
            # the last answer is handed back (the verifier makes it a retriable error)
            assert status == 503 and b"NOT_COORDINATOR" in body
            assert sum(asked.values()) == 4  # the first ask and three redirects
        finally:
            await pool.close()

    asyncio.run(check())
