"""Benchmark of the Python SDK: transactional against non-transactional throughput.

    python -m eos_bench.bench_sdk [--quick] [--seconds N] [--rounds N] [--json]

Starts one storage node (fsync on, KIP-890 verification on) and one coordinator (SQLite)
as processes, then sends 1 KB records for a fixed time with:

1. raw httpx: plain (non-idempotent) batches of the same size as the SDK's, one request
   in flight per partition from one thread each, no SDK at all: the baseline;
2. the idempotent ``Producer`` (sequence numbers, up to 5 batches in flight per partition);
3. the ``TransactionalProducer`` committing every 10 ms, 100 ms and 1 s;
4. the async twins, idempotent and transactional at 100 ms;
5. the hot paths (``bench/bench_sdk_hot.py``, on the same node): ``Producer.send`` and
   ``send_many`` of 100 B records against the node's own accept limit, a ``Consumer``
   reading read_committed, and the transactional/idempotent ratio at 1 KB and 100 ms
   commits as the median of 5 alternating rounds (``--no-hot`` leaves them out).

Records per second are those acknowledged (transactional: committed) during the run. The
cost of transactions is given against the idempotent producer of the same flavour; Kafka
reports about 3% at a 100 ms commit interval.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from sdk import (
    AsyncProducer,
    AsyncTransactionalProducer,
    Producer,
    TransactionalProducer,
)

TOKEN = "bench-internal-token-0123456789abcdef"
RECORD = "x" * 1024
PARTITIONS = 2
WINDOW = 1_000  # records sent ahead of their acknowledgement, at most (about 1 MB)
BATCH_SIZE = 16_384


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """One node and one coordinator as processes in a temporary directory."""

    def __init__(self, fsync: bool) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="eos-bench-sdk-"))
        self.node_port, self.coord_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.coord_port}"
        node_url = f"http://127.0.0.1:{self.node_port}"
        node_args = [
            sys.executable,
            "-m",
            "partition_service",
            "--node-id",
            "1",
            "--port",
            str(self.node_port),
            "--data-dir",
            str(self.dir / "node"),
            "--internal-token",
            TOKEN,
            "--coordinator-url",
            self.url,
            "--group-offset-partitions",
            "5",
            "--log-level",
            "warning",
        ]
        if not fsync:
            node_args.append("--no-fsync")
        coord_args = [
            sys.executable,
            "-m",
            "coordinator_service",
            "--port",
            str(self.coord_port),
            "--data-dir",
            str(self.dir / "coordinator"),
            "--nodes",
            f"1={node_url}",
            "--internal-token",
            TOKEN,
            "--group-offset-partitions",
            "5",
            "--log-level",
            "warning",
        ]
        log = open(self.dir / "services.log", "ab")  # noqa: SIM115 - owned by the children
        self.procs = [
            subprocess.Popen(node_args, stdout=log, stderr=subprocess.STDOUT),
            subprocess.Popen(coord_args, stdout=log, stderr=subprocess.STDOUT),
        ]
        for url in (node_url, self.url):
            self._wait_ready(url)

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"{url} did not become ready; see {self.dir / 'services.log'}")

    def topic(self, prefix: str) -> dict[str, Any]:
        return self.topic_with(prefix, PARTITIONS)

    def topic_with(self, prefix: str, partitions: int) -> dict[str, Any]:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        response = httpx.post(
            f"{self.url}/v1/topics", json={"name": name, "partitions": partitions}, timeout=30
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Result:
    name: str
    records: int
    seconds: float
    transactions: int = 0
    commit_ms: float = 0.0  # mean time in commit_transaction (flush + EndTxn)

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def mb_s(self) -> float:
        return self.rate * len(RECORD) / 1e6


# --- the runs ------------------------------------------------------------------------------


def run_raw(cluster: Cluster, seconds: float) -> Result:
    """Plain batches with httpx, one thread per partition: what the SDK adds is measured
    against this."""
    info = cluster.topic(f"raw-{os.getpid()}")
    per_batch = BATCH_SIZE // (len(RECORD) + 40)
    body = orjson.dumps({"records": [{"key": None, "value": RECORD}] * per_batch})
    counts = [0] * PARTITIONS
    stop = time.monotonic() + seconds

    def worker(partition: int) -> None:
        leader = info["partitions"][partition]["leader"]["url"]
        url = f"{leader}/v1/partitions/{info['name']}/{partition}/records"
        with httpx.Client(headers={"content-type": "application/json"}) as client:
            while time.monotonic() < stop:
                client.post(url, content=body).raise_for_status()
                counts[partition] += per_batch

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(p,)) for p in range(PARTITIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Result("raw httpx, plain batches", sum(counts), time.monotonic() - start)


def _windowed(send: Callable[[], Any], pending: collections.deque[Any]) -> None:
    pending.append(send())
    if len(pending) > WINDOW:
        pending.popleft().result()


def run_sync(cluster: Cluster, seconds: float, interval_ms: int | None) -> Result:
    topic = cluster.topic(f"sync-{interval_ms}-{os.getpid()}")["name"]
    sent = txns = 0
    in_commit = 0.0
    pending: collections.deque[Any] = collections.deque()
    start = time.monotonic()
    stop = start + seconds
    if interval_ms is None:
        with Producer(cluster.url, batch_size=BATCH_SIZE) as producer:
            while time.monotonic() < stop:
                for _ in range(100):
                    _windowed(lambda: producer.send(topic, RECORD), pending)
                sent += 100
            producer.flush()
        return Result("Producer (idempotent)", sent, time.monotonic() - start)
    producer_t = TransactionalProducer(
        cluster.url, f"bench-{interval_ms}-{uuid.uuid4().hex[:8]}", batch_size=BATCH_SIZE
    )
    producer_t.init_transactions()
    start = time.monotonic()
    stop = start + seconds
    while time.monotonic() < stop:
        end = time.monotonic() + interval_ms / 1000
        producer_t.begin_transaction()
        while time.monotonic() < end:
            for _ in range(20):
                _windowed(lambda: producer_t.send(topic, RECORD), pending)
            sent += 20
        committing = time.monotonic()
        producer_t.commit_transaction()
        in_commit += time.monotonic() - committing
        pending.clear()
        txns += 1
    elapsed = time.monotonic() - start
    producer_t.close()
    return Result(f"TransactionalProducer, commit every {interval_ms} ms", sent, elapsed, txns,
                  1000 * in_commit / txns)


async def _run_async(cluster: Cluster, seconds: float, interval_ms: int | None) -> Result:
    topic = cluster.topic(f"async-{interval_ms}-{os.getpid()}")["name"]
    sent = txns = 0
    in_commit = 0.0
    pending: collections.deque[Any] = collections.deque()

    async def windowed(future: asyncio.Future[Any]) -> None:
        pending.append(future)
        if len(pending) > WINDOW:
            await pending.popleft()

    if interval_ms is None:
        producer = AsyncProducer(cluster.url, batch_size=BATCH_SIZE)
        start = time.monotonic()
        while time.monotonic() < start + seconds:
            for _ in range(100):
                await windowed(await producer.send(topic, RECORD))
            sent += 100
        await producer.flush()
        elapsed = time.monotonic() - start
        await producer.close()
        return Result("AsyncProducer (idempotent)", sent, elapsed)
    producer_t = AsyncTransactionalProducer(
        cluster.url, f"abench-{interval_ms}-{uuid.uuid4().hex[:8]}", batch_size=BATCH_SIZE
    )
    await producer_t.init_transactions()
    start = time.monotonic()
    while time.monotonic() < start + seconds:
        end = time.monotonic() + interval_ms / 1000
        producer_t.begin_transaction()
        while time.monotonic() < end:
            for _ in range(20):
                await windowed(await producer_t.send(topic, RECORD))
            sent += 20
        committing = time.monotonic()
        await producer_t.commit_transaction()
        in_commit += time.monotonic() - committing
        pending.clear()
        txns += 1
    elapsed = time.monotonic() - start
    await producer_t.close()
    return Result(f"AsyncTransactionalProducer, commit every {interval_ms} ms", sent, elapsed,
                  txns, 1000 * in_commit / txns)


def run_async(cluster: Cluster, seconds: float, interval_ms: int | None) -> Result:
    return asyncio.run(_run_async(cluster, seconds, interval_ms))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 2 s runs")
    parser.add_argument("--seconds", type=float, default=None, help="per run (default 4)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    parser.add_argument("--no-fsync", action="store_true", help="node without fsync")
    parser.add_argument("--no-hot", action="store_true", help="leave out the hot paths")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    rounds = args.rounds or (1 if args.quick else 3)
    from eos_bench.bench_sdk_hot import hot_rows, run_hot

    def progress(step: str) -> None:
        print(f"... {step}", file=sys.stderr, flush=True)

    runs: list[Callable[[Cluster, float], Result]] = [
        run_raw,
        lambda c, s: run_sync(c, s, None),
        lambda c, s: run_sync(c, s, 10),
        lambda c, s: run_sync(c, s, 100),
        lambda c, s: run_sync(c, s, 1000),
        lambda c, s: run_async(c, s, None),
        lambda c, s: run_async(c, s, 100),
    ]
    cluster = Cluster(fsync=not args.no_fsync)
    try:
        # Every round runs every mode once, so load from outside this benchmark falls on
        # all of them alike; each mode's figure is its median round.
        results = [[run(cluster, seconds) for run in runs] for _ in range(rounds)]
        hot = {} if args.no_hot else run_hot(seconds, rounds, 5, progress, cluster)
    except BaseException:
        log = (cluster.dir / "services.log").read_text(errors="replace")
        print("--- services.log (tail) ---\n" + log[-4000:], file=sys.stderr)
        raise
    finally:
        cluster.stop()
    raw, idem, t10, t100, t1000, aidem, atxn = (
        sorted((r[i] for r in results), key=lambda r: r.rate)[rounds // 2]
        for i in range(len(runs))
    )
    txns = [t10, t100, t1000]

    rows: list[tuple[Result, Result | None]] = [
        (raw, None),
        (idem, None),
        *((t, idem) for t in txns),
        (aidem, None),
        (atxn, aidem),
    ]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "records_per_s": round(r.rate),
                        "mb_per_s": round(r.mb_s, 2),
                        "transactions": r.transactions, "commit_ms": round(r.commit_ms, 1),
                        "cost_vs_idempotent": None
                        if base is None
                        else round(1 - r.rate / base.rate, 4),
                    }
                    for r, base in rows
                ]
                + ([{"hot": hot}] if hot else []),
                indent=2,
            )
        )
        return 0
    fsync = "off" if args.no_fsync else "on"
    print(
        f"1 KB records, {PARTITIONS} partitions, 1 node (fsync {fsync}), median of {rounds} "
        f"rounds of {seconds:.0f} s runs, {os.cpu_count()} CPUs shared by client and "
        "services\n"
    )
    print(f"{'run':<52} {'records/s':>10} {'MB/s':>7} {'txns':>6} {'commit':>8} {'cost':>8}")
    for result, base in rows:
        cost = "" if base is None else f"{(1 - result.rate / base.rate) * 100:+.1f}%"
        txn = str(result.transactions) if result.transactions else ""
        commit = f"{result.commit_ms:.0f} ms" if result.transactions else ""
        print(f"{result.name:<52} {result.rate:>10,.0f} {result.mb_s:>7.1f} {txn:>6} "
              f"{commit:>8} {cost:>8}")
    if hot:
        print()
        for label, value, over in hot_rows(hot):
            vs = "" if over is None else f"{100 * over:.1f}% of the node's limit"
            print(f"{label:<52} {value:>10} {vs}")
    print("\ncommit: mean time in commit_transaction (flush of the last batches + EndTxn)")
    print("cost: throughput lost against the idempotent producer of the same flavour")
    return 0


if __name__ == "__main__":
    sys.exit(main())
