"""Fault injection at the transport seam: an ``httpx.MockTransport`` whose handler forwards
each request to the real server, except when the plan says otherwise.

Actions a plan can return for a request:

* ``None`` — forward it and return the real answer;
* ``"drop"`` — forward it (the server applies it) and lose the answer (a ReadError);
* ``"timeout_after"`` — forward it and time out waiting for the answer;
* ``"timeout_before"`` — time out before anything reaches the server;
* ``"503"`` — answer 503 KAFKA_STORAGE_ERROR without forwarding;
* ``"bare503"`` — answer a 503 without an error envelope, without forwarding;
* ``"CODE"`` (any other upper-case string) — answer that error code's envelope.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable

import httpx

from eos_protocol.errors import CATALOGUE

Plan = Callable[[httpx.Request], str | None]

_HOP_HEADERS = {"content-length", "transfer-encoding", "content-encoding", "connection"}


def is_produce(request: httpx.Request) -> bool:
    """A produce: one partition's (``.../records``) or several partitions' (``/v1/produce``)."""
    path = request.url.path
    return request.method == "POST" and (path.endswith("/records") or path == "/v1/produce")


def random_produce_faults(rate: float, seed: int, actions: list[str]) -> Plan:
    rng = random.Random(seed)
    lock = threading.Lock()

    def plan(request: httpx.Request) -> str | None:
        if not is_produce(request):
            return None
        with lock:
            return rng.choice(actions) if rng.random() < rate else None

    return plan


class FaultyServer:
    """Counts what it injected in ``injected`` (action -> count)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.injected: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.max_concurrent: Counter[str] = Counter()
        self._concurrent: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._sync = httpx.HTTPTransport()
        self._async: httpx.AsyncHTTPTransport | None = None

    def _decide(self, request: httpx.Request) -> str | None:
        action = self.plan(request)
        with self._lock:
            self.requests[f"{request.method} {request.url.path}"] += 1
            if action is not None:
                self.injected[action] += 1
        return action

    @staticmethod
    def _early(action: str | None, request: httpx.Request) -> httpx.Response | None:
        if action == "timeout_before":
            raise httpx.ConnectTimeout("injected", request=request)
        if action == "bare503":
            return httpx.Response(503, text="Service Unavailable")
        if action == "503":
            action = "KAFKA_STORAGE_ERROR"
        if action is not None and action in CATALOGUE:
            spec = CATALOGUE[action]
            return httpx.Response(spec.http_status, json={"error": {
                "code": action, "message": "injected", "retriable": spec.retriable}})
        return None

    @staticmethod
    def _late(action: str | None, request: httpx.Request, real: httpx.Response) -> httpx.Response:
        if action == "drop":
            raise httpx.ReadError("injected: answer lost", request=request)
        if action == "timeout_after":
            raise httpx.ReadTimeout("injected: no answer", request=request)
        headers = {k: v for k, v in real.headers.items() if k.lower() not in _HOP_HEADERS}
        return httpx.Response(real.status_code, headers=headers, content=real.content)

    def _enter(self, request: httpx.Request) -> str:
        kind = "produce" if is_produce(request) else "other"
        with self._lock:
            self._concurrent[kind] += 1
            self.max_concurrent[kind] = max(self.max_concurrent[kind], self._concurrent[kind])
        return kind

    def _leave(self, kind: str, real: httpx.Response) -> None:
        with self._lock:
            self._concurrent[kind] -= 1
            self.statuses[real.status_code] += 1

    def handle(self, request: httpx.Request) -> httpx.Response:
        action = self._decide(request)
        early = self._early(action, request)
        if early is not None:
            return early
        kind = self._enter(request)
        real = self._sync.handle_request(request)
        real.read()
        self._leave(kind, real)
        return self._late(action, request, real)

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        action = self._decide(request)
        early = self._early(action, request)
        if early is not None:
            return early
        if self._async is None:
            self._async = httpx.AsyncHTTPTransport()
        kind = self._enter(request)
        real = await self._async.handle_async_request(request)
        await real.aread()
        self._leave(kind, real)
        return self._late(action, request, real)

    def close_sync(self) -> None:
        self._sync.close()

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()

    def transport(self, kind: str) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle if kind == "sync" else self.ahandle)
