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
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import orjson
import psycopg
import uvloop

from eos_bench.harness import CLK_TCK, Conn, cpu_seconds
from eos_cli.launcher import ClusterPlan, LocalCluster

PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
TOKEN = "bench-internal-token-0123456789abcdef"
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


STEPS = ("add", "produce", "commit")


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / CLK_TCK, sum(values) / CLK_TCK


def postgres_seconds() -> float:
    """CPU seconds of every PostgreSQL process (server and backends, whoever they serve)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                total += cpu_seconds(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return total


async def producer(
    index: int,
    coord_port: int,
    node_port: int,
    partitions: int,
    stop_at: float,
    counts: list[int],
    latencies: list[float],
    steps: dict[str, list[float]],
    wait_for_markers: bool,
) -> None:
    """One transactional producer: init once, then add partition / produce / commit."""
    coord, node = await Conn(coord_port).open(), await Conn(node_port).open()
    try:
        tid = f"bench-{index}"
        ident = orjson.loads(
            (await coord.request("POST", f"/v1/transactions/{tid}/init", b"{}"))[1]
        )
        ident = {"producer_id": ident["producer_id"], "producer_epoch": ident["producer_epoch"]}
        partition = index % partitions
        add_body = orjson.dumps(
            {**ident, "partitions": [{"topic": "bench", "partition": partition}]}
        )
        end_body = orjson.dumps({**ident, "wait_for_markers": wait_for_markers})
        seq = 0
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            status, answer = await coord.request(
                "POST", f"/v1/transactions/{tid}/partitions", add_body
            )
            if status == 503:  # the previous transaction's markers are still on their way
                RETRIES[0] += 1
                await asyncio.sleep(0.002)
                continue
            assert status == 200, answer
            t1 = time.monotonic()
            produce = orjson.dumps(
                {
                    **ident,
                    "base_sequence": seq,
                    "transactional": True,
                    "records": [{"key": f"k{seq}", "value": "x" * 100}],
                }
            )
            status, answer = await node.request(
                "POST", f"/v1/partitions/bench/{partition}/records", produce
            )
            assert status == 200, answer
            seq += 1
            t2 = time.monotonic()
            status, answer = await coord.request("POST", f"/v1/transactions/{tid}/commit", end_body)
            assert status == 200, answer
            t3 = time.monotonic()
            counts[index] += 1
            latencies.append(t3 - t0)
            for name, took in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                steps[name].append(took)
    finally:
        await coord.close()
        await node.close()


async def run_producers(
    coord_port: int,
    node_port: int,
    producers: int,
    partitions: int,
    seconds: float,
    wait_for_markers: bool,
    pids: list[int],
) -> dict[str, object]:
    """Warm up for 2 s, then measure ``seconds``; CPU of each process over the window."""

    async def phase(duration: float) -> tuple[list[int], list[float], dict[str, list[float]]]:
        counts = [0] * producers
        latencies: list[float] = []
        steps: dict[str, list[float]] = {name: [] for name in STEPS}
        stop_at = time.monotonic() + duration
        await asyncio.gather(
            *(
                producer(
                    i,
                    coord_port,
                    node_port,
                    partitions,
                    stop_at,
                    counts,
                    latencies,
                    steps,
                    wait_for_markers,
                )
                for i in range(producers)
            )
        )
        return counts, latencies, steps

    await phase(2.0)
    cpu0 = [cpu_seconds(pid) for pid in pids]
    pg0, (busy0, total0) = postgres_seconds(), machine_busy_seconds()
    mine0, start = time.process_time(), time.monotonic()
    counts, latencies, steps = await phase(seconds)
    elapsed = time.monotonic() - start
    cpu = [(cpu_seconds(pid) - c0) / elapsed for pid, c0 in zip(pids, cpu0, strict=True)]
    busy1, total1 = machine_busy_seconds()
    cpu.append((postgres_seconds() - pg0) / elapsed)
    return {
        "committed": sum(counts),
        "elapsed": elapsed,
        "latencies": latencies,
        "steps": steps,
        "cpu": cpu,
        "client_cpu": (time.process_time() - mine0) / elapsed,
        "machine_busy": (busy1 - busy0) / max(total1 - total0, 1e-9),
    }


def percentile_ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    parser.add_argument(
        "--wait-for-markers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count a transaction once CompleteCommit (default) or once PrepareCommit",
    )
    args = parser.parse_args()

    dbname = f"eos_bench_{uuid.uuid4().hex[:8]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = f"postgresql+psycopg://{PG['user']}@{PG['host']}:{PG['port']}/{dbname}"
    work = Path(tempfile.mkdtemp(prefix="eos-bench-"))
    cluster = LocalCluster(
        ClusterPlan(
            data_dir=work, nodes=1, port_base=None, database_url=url, token=TOKEN,
            group_offset_partitions=5, own_session=False,
        )
    )  # fmt: skip
    node, coordinator = cluster.node(1), cluster.coordinators[0]
    coord_port, node_port, coord_url = coordinator.port, node.port, coordinator.url
    try:
        cluster.start()
        httpx.post(
            f"{coord_url}/v1/topics", json={"name": "bench", "partitions": args.partitions}
        ).raise_for_status()
        assert node.process is not None and coordinator.process is not None
        pids = [coordinator.process.pid, node.process.pid]
        xact0, rows0 = pg_stats(dbname)
        result = uvloop.run(
            run_producers(
                coord_port,
                node_port,
                args.producers,
                args.partitions,
                args.seconds,
                args.wait_for_markers,
                pids,
            )
        )
        xact1, rows1 = pg_stats(dbname)
        cluster.stop()
        committed, elapsed = int(result["committed"]), float(result["elapsed"])  # type: ignore[arg-type]
        latencies: list[float] = result["latencies"]  # type: ignore[assignment]
        steps: dict[str, list[float]] = result["steps"]  # type: ignore[assignment]
        cpu: list[float] = result["cpu"]  # type: ignore[assignment]
        rate = committed / elapsed
        writes_per_txn = 3  # add partitions, PrepareCommit, CompleteCommit
        state_writes = rate * writes_per_txn
        print(
            f"producers={args.producers} partitions={args.partitions} seconds={elapsed:.1f} "
            f"wait_for_markers={args.wait_for_markers}"
        )
        print(
            f"committed transactions: {committed} -> {rate:.0f} txn/s "
            f"(p50 {percentile_ms(latencies, 0.5):.1f} ms, p99 {percentile_ms(latencies, 0.99):.1f}"
            " ms per add+produce+commit)"
        )
        print(
            "  per step p50/p99 ms: "
            + ", ".join(
                f"{name} {percentile_ms(v, 0.5):.1f}/{percentile_ms(v, 0.99):.1f}"
                for name, v in steps.items()
            )
        )
        print(
            f"  cpu: coordinator {cpu[0]:.0%}, node {cpu[1]:.0%}, postgres (all) {cpu[2]:.0%}, "
            f"load generator {float(result['client_cpu']):.0%} "  # type: ignore[arg-type]
            f"(of one core each; the machine has {os.cpu_count()}, "
            f"{float(result['machine_busy']):.0%} busy overall incl. other work)"  # type: ignore[arg-type]
        )
        if committed:
            per_txn = ", ".join(
                f"{name} {1000 * c / rate:.2f}"
                for name, c in zip(("coordinator", "node", "postgres"), cpu, strict=True)
            )
            print(f"  cpu ms per committed transaction: {per_txn}")
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
        cluster.stop()
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
