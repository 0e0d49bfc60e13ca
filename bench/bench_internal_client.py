"""Benchmark: the services' internal HTTP client against httpx, raw httpcore and h11.

    python -m eos_bench.bench_internal_client [--seconds 4] [--rounds 3] [--concurrency 8]

The coordinator's marker POSTs and a storage node's KIP-890 verification GETs go through
``eos_server.keepalive.KeepAliveClient``, a hand-written HTTP/1.1 client; the benchmarks'
load comes from it too (``bench/harness.py``). This measures what it saves, in one run:
each client sends the same requests — a GET, and a POST with a small JSON body, as the
internal calls are — from ``--concurrency`` loops on keep-alive connections to the same
local no-op server (``bench/noop_server.py``, uvicorn, one process) on uvloop, as the
services run. Per client it prints requests per second, this process's CPU per request
(the client's own cost: nothing else runs here) and the server's.

* ``keepalive``: ``KeepAliveClient``;
* ``httpx``: ``httpx.AsyncClient``, the SDK's client;
* ``httpcore``: httpx's transport alone (``httpcore.AsyncConnectionPool``);
* ``h11``: the h11 state machine over asyncio streams, with an idle list as pool: the
  least a client built on a standard HTTP/1.1 parser can cost.

The machine's limit is measured in the same run: the no-op server driven by canned
request bytes on raw connections, which costs next to nothing in this process, so the
server is all that bounds it. Clients alternate round by round, so a busy spell of the
machine falls on all of them alike; each figure is the median round.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import h11
import httpcore
import httpx
import uvloop

from eos_bench.harness import TOKEN, Server, cpu_seconds, free_port
from eos_server.keepalive import KeepAliveClient

GET_PATH = "/readyz"
POST_PATH = "/raw/bench/0/records"
POST_BODY = b'{"records": [{"key": "k", "value": "v"}]}'
HEADERS = {"authorization": f"Bearer {TOKEN}"}
POST_HEADERS = {**HEADERS, "content-type": "application/json"}

Send = Callable[[str, str, bytes], Awaitable[int]]  # method, path, body -> status


@dataclass
class Figures:
    name: str
    requests_per_s: float
    client_us: float  # this process's CPU per request
    server_us: float  # the server's CPU per request


class Client(abc.ABC):
    """One client under test: ``send`` one request, ``close`` its connections."""

    name = ""

    @abc.abstractmethod
    async def send(self, method: str, path: str, body: bytes) -> int:
        """Send one request and return its status."""

    async def close(self) -> None:
        return None


class KeepAlive(Client):
    name = "keepalive"

    def __init__(self, base: str, concurrency: int) -> None:
        self.base = base
        self.client = KeepAliveClient(timeout_s=10, max_idle_per_host=concurrency)

    async def send(self, method: str, path: str, body: bytes) -> int:
        headers = POST_HEADERS if body else HEADERS
        status, _ = await self.client.request(method, self.base + path, body, headers)
        return status

    async def close(self) -> None:
        await self.client.close()


class Httpx(Client):
    name = "httpx"

    def __init__(self, base: str, concurrency: int) -> None:
        self.base = base
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(timeout=10, limits=limits)

    async def send(self, method: str, path: str, body: bytes) -> int:
        headers = POST_HEADERS if body else HEADERS
        response = await self.client.request(method, self.base + path, content=body,
                                             headers=headers)
        return response.status_code

    async def close(self) -> None:
        await self.client.aclose()


class Httpcore(Client):
    name = "httpcore"

    def __init__(self, base: str, concurrency: int) -> None:
        self.base = base
        self.pool = httpcore.AsyncConnectionPool(max_connections=concurrency)
        self.get_headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]
        self.post_headers = [(k.encode(), v.encode()) for k, v in POST_HEADERS.items()]

    async def send(self, method: str, path: str, body: bytes) -> int:
        headers = self.post_headers if body else self.get_headers
        response = await self.pool.request(method, self.base + path, headers=headers,
                                           content=body or None)
        return response.status

    async def close(self) -> None:
        await self.pool.aclose()


class H11(Client):
    """h11 over asyncio streams; connections kept in a LIFO idle list."""

    name = "h11"

    def __init__(self, port: int, concurrency: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]] = []

    async def send(self, method: str, path: str, body: bytes) -> int:
        if self.idle:
            reader, writer, conn = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            conn = h11.Connection(h11.CLIENT)
        headers = [("host", "127.0.0.1"), *(POST_HEADERS if body else HEADERS).items()]
        if body:
            headers.append(("content-length", str(len(body))))
        data = conn.send(h11.Request(method=method, target=path, headers=headers))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            self.idle.append((reader, writer, conn))
        else:
            writer.close()
        return status

    async def close(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()
        self.idle.clear()


async def _drive(client: Client, server_pid: int, concurrency: int, seconds: float) -> Figures:
    """``concurrency`` loops, each a GET then a POST, counted over ``seconds`` after a
    warm-up second."""
    window = {"open": False, "closed": False}
    done = [0]

    async def loop() -> None:
        while not window["closed"]:
            for method, path, body in (("GET", GET_PATH, b""), ("POST", POST_PATH, POST_BODY)):
                status = await client.send(method, path, body)
                if status != 200:
                    raise RuntimeError(f"{client.name}: {method} {path} answered {status}")
                if window["open"] and not window["closed"]:
                    done[0] += 1

    tasks = [asyncio.create_task(loop()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(1.0)
        cpu0, server0, t0 = time.process_time(), cpu_seconds(server_pid), time.monotonic()
        window["open"] = True
        await asyncio.sleep(seconds)
        window["closed"] = True
        elapsed = time.monotonic() - t0
        cpu, server = time.process_time() - cpu0, cpu_seconds(server_pid) - server0
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await client.close()
    n = max(done[0], 1)
    return Figures(client.name, done[0] / elapsed, 1e6 * cpu / n, 1e6 * server / n)


async def _canned(port: int, server_pid: int, concurrency: int, seconds: float) -> Figures:
    """The machine's limit: the same requests as prebuilt bytes on raw connections, each
    answer's end found from its content-length with no parsing beyond it."""
    get = (f"GET {GET_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
           f"authorization: Bearer {TOKEN}\r\n\r\n").encode()
    post = (f"POST {POST_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {TOKEN}"
            f"\r\ncontent-type: application/json\r\ncontent-length: {len(POST_BODY)}\r\n\r\n"
            ).encode() + POST_BODY

    class Raw(Client):
        name = "limit (canned requests)"

        def __init__(self) -> None:
            self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

        async def send(self, method: str, path: str, body: bytes) -> int:
            if self.idle:
                reader, writer = self.idle.pop()
            else:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post if body else get)
            head = await reader.readuntil(b"\r\n\r\n")
            start = head.find(b"content-length:") + 15
            await reader.readexactly(int(head[start:head.index(b"\r\n", start)]))
            self.idle.append((reader, writer))
            return int(head[9:12])

        async def close(self) -> None:
            for _, writer in self.idle:
                writer.close()

    return await _drive(Raw(), server_pid, concurrency, seconds)


async def run(seconds: float, rounds: int, concurrency: int) -> list[Figures]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    makers: list[Callable[[], Client]] = [
        lambda: KeepAlive(base, concurrency),
        lambda: Httpx(base, concurrency),
        lambda: Httpcore(base, concurrency),
        lambda: H11(port, concurrency),
    ]
    runs: dict[str, list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="eos-bench-client-") as scratch:
        argv = [sys.executable, "-m", "eos_bench.noop_server", "--port", str(port)]
        server = Server(argv, port, Path(scratch) / "noop.log")
        server.start()
        try:
            for _ in range(rounds):
                for make in makers:
                    figures = await _drive(make(), server.pid, concurrency, seconds)
                    runs.setdefault(figures.name, []).append(figures)
                limit = await _canned(port, server.pid, concurrency, seconds)
                runs.setdefault(limit.name, []).append(limit)
        finally:
            server.stop()
    return [_median(name, results) for name, results in runs.items()]


def _median(name: str, results: list[Figures]) -> Figures:
    return Figures(
        name,
        statistics.median(r.requests_per_s for r in results),
        statistics.median(r.client_us for r in results),
        statistics.median(r.server_us for r in results),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    uvloop.install()
    results = asyncio.run(run(args.seconds, args.rounds, args.concurrency))
    limit = results[-1].requests_per_s
    print(f"{args.concurrency} loops, GET + small POST to the no-op server; "
          f"median of {args.rounds} rounds of {args.seconds:g} s")
    print(f"{'client':26}{'requests/s':>12}{'of limit':>10}{'client CPU':>13}"
          f"{'server CPU':>13}")
    for r in results:
        print(f"{r.name:26}{r.requests_per_s:>12,.0f}{r.requests_per_s / limit:>10.0%}"
              f"{r.client_us:>10.1f} us{r.server_us:>10.1f} us")


if __name__ == "__main__":
    main()
