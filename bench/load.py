"""Closed-loop load: one request loop per connection, counted inside a measured window,
with the CPU of the server and of this process over the same window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from eos_bench.harness import Conn, cpu_seconds


@dataclass
class LoadResult:
    seconds: float
    requests: int
    records: int
    body_bytes: int
    latencies: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    client_cpu: float = 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.body_bytes / self.seconds / 1e6

    def latency_ms(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Step = Callable[[Conn], Awaitable[tuple[int, int]]]  # -> (records, bytes)


async def drive(
    port: int,
    server_pid: int,
    steps: list[Step],
    warmup_s: float,
    measure_s: float,
    on_window: Callable[[bool], Awaitable[None]] | None = None,
) -> LoadResult:
    """Run one loop per step (each on its own connection) for warmup + measure seconds and
    count what completes inside the measured window."""
    conns = [await Conn(port).open() for _ in steps]
    window = {"open": False, "closed": False}
    result = LoadResult(seconds=measure_s, requests=0, records=0, body_bytes=0)

    async def loop(step: Step, conn: Conn) -> None:
        while not window["closed"]:
            began = time.monotonic()
            records, size = await step(conn)
            if window["open"] and not window["closed"]:
                result.latencies.append(time.monotonic() - began)
                result.requests += 1
                result.records += records
                result.body_bytes += size

    tasks = [asyncio.create_task(loop(step, conn)) for step, conn in zip(steps, conns, strict=True)]
    try:
        await asyncio.sleep(warmup_s)
        if on_window is not None:
            await on_window(True)
        cpu0, mine0, t0 = cpu_seconds(server_pid), time.process_time(), time.monotonic()
        window["open"] = True
        await asyncio.sleep(measure_s)
        window["closed"] = True
        elapsed = time.monotonic() - t0
        result.seconds = elapsed
        result.server_cpu = (cpu_seconds(server_pid) - cpu0) / elapsed
        result.client_cpu = (time.process_time() - mine0) / elapsed
        if on_window is not None:
            await on_window(False)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for conn in conns:
            await conn.close()
    return result
