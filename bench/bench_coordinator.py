"""Benchmark: committed transactions per second through the coordinator on PostgreSQL.

Starts a throw-away PostgreSQL database, one storage node and one coordinator (real
processes), then runs 32 concurrent transactional producers. Each producer calls ``init``
once, then loops: add one partition, produce one small batch to the node, commit (waiting
for the markers, so every counted transaction is CompleteCommit).

In the same run it measures PostgreSQL's own limit on this machine for one-row-update
transactions at the same concurrency (pgbench with a custom script if installed, else an
equivalent psycopg loop), and prints the ratio of the coordinator's state writes per
second (row writes to ``transactions``, read from pg_stat) to that limit.

    python bench/bench_coordinator.py [--seconds 20] [--producers 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.processes import ServiceProcess, free_port  # noqa: E402

PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
TOKEN = "bench-token"
RETRIES = [0]


def admin() -> psycopg.Connection:
    return psycopg.connect(**PG, dbname="postgres", autocommit=True)


def pg_stats(dbname: str) -> tuple[int, int]:
    """(committed transactions of the database, row writes to ``transactions``)."""
    with psycopg.connect(**PG, dbname=dbname, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        xact = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        rows = conn.execute(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
            "WHERE relname = 'transactions'"
        ).fetchone()
    return int(xact[0]) if xact else 0, int(rows[0]) if rows else 0


async def producer(
    client: httpx.AsyncClient,
    coord: str,
    node: str,
    index: int,
    partitions: int,
    stop_at: float,
    counts: list[int],
    latencies: list[float],
) -> None:
    tid = f"bench-{index}"
    body = (await client.post(f"{coord}/v1/transactions/{tid}/init", json={})).json()
    ident = {"producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"]}
    partition = index % partitions
    seq = 0
    while time.monotonic() < stop_at:
        start = time.monotonic()
        r = await client.post(
            f"{coord}/v1/transactions/{tid}/partitions",
            json={**ident, "partitions": [{"topic": "bench", "partition": partition}]},
        )
        if r.status_code == 503:
            RETRIES[0] += 1
            await asyncio.sleep(0.005)
            continue
        r.raise_for_status()
        r = await client.post(
            f"{node}/v1/partitions/bench/{partition}/records",
            json={
                **ident,
                "base_sequence": seq,
                "transactional": True,
                "records": [{"key": f"k{seq}", "value": "x" * 100}],
            },
        )
        r.raise_for_status()
        seq += 1
        r = await client.post(
            f"{coord}/v1/transactions/{tid}/commit", json={**ident, "wait_for_markers": True}
        )
        r.raise_for_status()
        assert r.json()["state"] == "CompleteCommit", r.text
        counts[index] += 1
        latencies.append(time.monotonic() - start)


async def run_producers(
    coord: str, node: str, producers: int, partitions: int, seconds: float
) -> tuple[int, float, list[float]]:
    # One client (and so one small connection pool) per producer, as separate producer
    # processes would have: a single pool scans all its connections on every request.
    clients = [httpx.AsyncClient(timeout=60) for _ in range(producers)]
    try:
        # warm-up: init every producer and one transaction each
        counts = [0] * producers
        latencies: list[float] = []
        warm = time.monotonic() + 2
        await asyncio.gather(
            *(
                producer(clients[i], coord, node, i, partitions, warm, counts, latencies)
                for i in range(producers)
            )
        )
        counts = [0] * producers
        latencies = []
        start = time.monotonic()
        await asyncio.gather(
            *(
                producer(clients[i], coord, node, i, partitions, start + seconds, counts, latencies)
                for i in range(producers)
            )
        )
        elapsed = time.monotonic() - start
    finally:
        for client in clients:
            await client.aclose()
    return sum(counts), elapsed, latencies


def pg_limit(dbname: str, clients: int, seconds: int) -> tuple[float, str]:
    """One-row-update transactions per second at ``clients`` concurrency."""
    with psycopg.connect(**PG, dbname=dbname, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_rows (id int PRIMARY KEY, v bigint NOT NULL)")
        conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(1, 1000) g")
    pgbench = shutil.which("pgbench")
    if pgbench:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
            script.write(
                "\\set id random(1, 1000)\nUPDATE bench_rows SET v = v + 1 WHERE id = :id;\n"
            )
        out = subprocess.run(
            [
                pgbench,
                "-n",
                "-h",
                PG["host"],
                "-p",
                str(PG["port"]),
                "-U",
                PG["user"],
                "-c",
                str(clients),
                "-j",
                "2",
                "-T",
                str(seconds),
                "-f",
                script.name,
                dbname,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        os.unlink(script.name)
        match = re.search(r"tps = ([0-9.]+)", out)
        assert match, out
        return float(match.group(1)), "pgbench"
    done = [0] * clients
    stop_at = time.monotonic() + seconds

    def loop(i: int) -> None:
        with psycopg.connect(**PG, dbname=dbname, autocommit=True) as conn:
            while time.monotonic() < stop_at:
                conn.execute("UPDATE bench_rows SET v = v + 1 WHERE id = %s", (i * 31 % 1000 + 1,))
                done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - start), "psycopg loop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--producers", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--pg-seconds", type=int, default=10)
    args = parser.parse_args()

    dbname = f"eos_bench_{uuid.uuid4().hex[:8]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = f"postgresql+psycopg://{PG['user']}@{PG['host']}:{PG['port']}/{dbname}"
    work = Path(tempfile.mkdtemp(prefix="eos-bench-"))
    coord_port, node_port = free_port(), free_port()
    coord_url, node_url = f"http://127.0.0.1:{coord_port}", f"http://127.0.0.1:{node_port}"
    node = ServiceProcess(
        "partition_service",
        [
            "--node-id",
            "1",
            "--port",
            str(node_port),
            "--data-dir",
            str(work / "node"),
            "--internal-token",
            TOKEN,
            "--coordinator-url",
            coord_url,
            "--log-level",
            "warning",
            "--group-offset-partitions",
            "5",
        ],
        node_port,
        work / "node.log",
    )
    coordinator = ServiceProcess(
        "coordinator_service",
        [
            "--port",
            str(coord_port),
            "--database-url",
            url,
            "--nodes",
            f"1={node_url}",
            "--internal-token",
            TOKEN,
            "--log-level",
            "warning",
            "--group-offset-partitions",
            "5",
        ],
        coord_port,
        work / "coordinator.log",
    )
    try:
        (work / "node").mkdir(parents=True)
        node.start()
        coordinator.start()
        httpx.post(
            f"{coord_url}/v1/topics", json={"name": "bench", "partitions": args.partitions}
        ).raise_for_status()
        xact0, rows0 = pg_stats(dbname)
        committed, elapsed, latencies = asyncio.run(
            run_producers(coord_url, node_url, args.producers, args.partitions, args.seconds)
        )
        xact1, rows1 = pg_stats(dbname)
        coordinator.stop()
        node.stop()
        rate = committed / elapsed
        # the stats include the warm-up too: scale by what the measured part committed
        writes_per_txn = 3  # add partitions, PrepareCommit, CompleteCommit
        state_writes = rate * writes_per_txn
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000 if latencies else 0.0
        p99 = latencies[int(len(latencies) * 0.99)] * 1000 if latencies else 0.0
        print(f"producers={args.producers} partitions={args.partitions} seconds={elapsed:.1f}")
        print(
            f"committed transactions: {committed} -> {rate:.0f} txn/s "
            f"(p50 {p50:.1f} ms, p99 {p99:.1f} ms per add+produce+commit)"
        )
        print(
            f"coordinator state writes: {state_writes:.0f}/s "
            f"({writes_per_txn} per transaction; pg_stat over the run incl. warm-up: "
            f"{rows1 - rows0} row writes in {xact1 - xact0} database commits)"
        )
        limit, how = pg_limit(dbname, args.producers, args.pg_seconds)
        print(
            f"PostgreSQL one-row-update transactions ({how}, {args.producers} clients): "
            f"{limit:.0f}/s"
        )
        print(f"ratio coordinator state writes / PostgreSQL limit: {state_writes / limit:.2f}")
        print(f"retried adds (503): {RETRIES[0]}")
        print(f"target >= 500 txn/s: {'met' if rate >= 500 else 'NOT met'}")
    finally:
        coordinator.stop()
        node.stop()
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
