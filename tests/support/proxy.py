"""A fault-injecting HTTP/1.1 proxy on loopback, the one transport seam the chaos tests
mock at (a test cluster puts it in place with ``ClusterSpec(proxied_node=...)``).

It stands between two services (a coordinator and a storage node) as a plain TCP
listener: each client connection gets its own upstream connection, and requests are
relayed one at a time in both directions, keep-alive included. For a request whose path
starts with one of the plan's prefixes it may, after forwarding the request and reading
the whole answer (so the server *has* applied it):

* **delay** the answer by ``delay_s`` before passing it on, or
* **drop** it: close the client's connection without a byte of the answer, which the
  client sees as a lost connection with the outcome unknown.

With ``cut_rate`` it may instead **cut** the request: close the client's connection
without forwarding it, so the server never sees it (a network partition).

Everything else is passed through untouched, so clients that learn the proxy's URL from
the cluster metadata keep working. The proxy runs an asyncio loop on a thread of the test
process; the plan can be changed while it runs and every decision is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import Counter
from dataclasses import dataclass

from tests.support.processes import free_port, wait_until

_HEADER_LIMIT = 1 << 20


@dataclass(frozen=True)
class FaultPlan:
    """What to do to the answers of requests whose path starts with one of ``paths``."""

    paths: tuple[str, ...] = ("/internal/",)
    delay_rate: float = 0.0
    delay_s: float = 0.0
    drop_rate: float = 0.0
    cut_rate: float = 0.0  # requests never forwarded


NO_FAULTS = FaultPlan()


class _Closed(Exception):
    """The peer closed the connection between messages."""


async def _read_message(reader: asyncio.StreamReader, *, request_method: str | None) -> bytes:
    """One whole HTTP/1.1 message (head and body) as raw bytes. ``request_method`` is
    None when reading a request, else the method of the request being answered."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed from None
        raise
    except asyncio.LimitOverrunError:
        raise _Closed from None
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    if request_method is not None:
        status = int(lines[0].split(" ", 2)[1])
        if request_method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return head
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return head + await _read_chunked(reader)
    if "content-length" in headers:
        return head + await reader.readexactly(int(headers["content-length"]))
    if request_method is None:
        return head  # a request without a body
    return head + await reader.read()  # an answer delimited by the connection's end


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        body += size_line
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the empty line
                line = await reader.readuntil(b"\r\n")
                body += line
                if line == b"\r\n":
                    return body
        body += await reader.readexactly(size + 2)


class FaultProxy:
    """``FaultProxy(upstream_port).start()``; point a service at ``proxy.url``."""

    def __init__(self, upstream_port: int, *, port: int | None = None, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self.plan = NO_FAULTS
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._stopped = asyncio.Event()
        self._relays: set[asyncio.Task[None]] = set()  # one per client connection

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_plan(self, plan: FaultPlan) -> None:
        self.plan = plan

    def start(self) -> FaultProxy:
        self._thread.start()
        wait_until(lambda: self._server is not None, timeout=10, what="the proxy to listen")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, limit=_HEADER_LIMIT
        )
        self._server = server
        async with server:
            await self._stopped.wait()
            server.close()
            # the connections still open are closed here, not left to the garbage
            # collector once the loop is gone (unclosed sockets, pending tasks)
            for task in list(self._relays):
                task.cancel()
            await asyncio.gather(*self._relays, return_exceptions=True)

    def _decide(self, request_head: bytes) -> str | None:
        plan = self.plan
        try:
            _method, path = request_head.split(b" ", 2)[:2]
        except ValueError:
            return None
        if not any(path.decode("latin-1").startswith(p) for p in plan.paths):
            return None
        if plan.cut_rate and self._rng.random() < plan.cut_rate:
            return "cut"
        roll = self._rng.random()
        if roll < plan.drop_rate:
            return "drop"
        if roll < plan.drop_rate + plan.delay_rate:
            return "delay"
        return None

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_w: asyncio.StreamWriter | None = None
        task = asyncio.current_task()
        if task is not None:
            self._relays.add(task)
        try:
            upstream_r, upstream_w = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port, limit=_HEADER_LIMIT
            )
            while True:
                request = await _read_message(client_r, request_method=None)
                method = request.split(b" ", 1)[0].decode("latin-1")
                action = self._decide(request)
                if action == "cut":
                    self.counts["cut"] += 1
                    return  # the server never hears of it
                upstream_w.write(request)
                await upstream_w.drain()
                answer = await _read_message(upstream_r, request_method=method)
                self.counts["forwarded"] += 1
                if action == "drop":
                    self.counts["dropped"] += 1
                    return  # the server applied it; the client never hears
                if action == "delay":
                    self.counts["delayed"] += 1
                    await asyncio.sleep(self.plan.delay_s)
                client_w.write(answer)
                await client_w.drain()
        except (_Closed, OSError, asyncio.IncompleteReadError, ValueError):
            return  # either side went away (a node restarting, a client closing)
        finally:
            if task is not None:
                self._relays.discard(task)
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
