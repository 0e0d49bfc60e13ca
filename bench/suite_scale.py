"""The ``scale`` part of ``eos bench``: committed transactions per second with 1, 2 and 4
coordinator instances on one PostgreSQL database, at 32 and 128 producers, and what each
committed transaction costs in CPU summed over every process that serves it.

Each instance count gets a fresh database and a fresh cluster (one storage node, K
coordinators sharing the transaction-log partitions); the load starts once the leases
are shared evenly. Every producer is a closed loop over its own transactional id, talking
to the instance that owns it (found with ``GET /v1/coordinators``, as the SDK does), one
100-byte record to one partition per transaction, each commit waiting for its markers.

Two flows: ``v1`` (the client adds the partition, produces, commits) and ``v2`` (KIP-890
part 2: the node adds the partition on the first batch and every commit bumps the
epoch, so the client only produces and commits).

CPU per committed transaction is the CPU time of the coordinators, the node and every
PostgreSQL process over the window, divided by the transactions committed in it; the
load generator's own CPU is shown beside it, not counted. PostgreSQL's commits per
transaction come from ``pg_stat_database``, the node's fsyncs and markers per transaction
from its metrics: together, where the round trips and the disk flushes of a commit go.

    python -m eos_bench.suite_scale --instances 1,2,4 --producers 32,128 --flow v2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from eos_bench.bench_coordinator import machine_busy_seconds, pg_stats, postgres_seconds
from eos_bench.harness import Conn, HttpError, cpu_seconds
from eos_bench.suite_coord import bench_plan, pg_database
from eos_cli.launcher import LocalCluster

TOPIC = "scale"
TOPIC_PARTITIONS = 16
LOG_PARTITIONS = 50
VALUE = "x" * 100


@dataclass
class ScaleRun:
    instances: int
    producers: int
    flow: str
    committed: int = 0
    seconds: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    pg_commits: int = 0
    node: dict[str, float] = field(default_factory=dict)
    busy: float = 0.0
    load_generator_s: float = 0.0
    retries: int = 0
    shares: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        served = sum(v for k, v in self.cpu_s.items() if k != "load_generator")
        per_txn = served / self.committed * 1000 if self.committed else 0.0
        return {
            "instances": self.instances,
            "log_partitions_per_instance": self.shares,
            "producers": self.producers,
            "flow": self.flow,
            "committed": self.committed,
            "txn_per_s": round(self.committed / self.seconds, 1) if self.seconds else 0.0,
            "cpu_ms_per_txn": round(per_txn, 3),
            "cpu_ms_per_txn_by_process": {
                k: round(v / self.committed * 1000, 3) if self.committed else 0.0
                for k, v in self.cpu_s.items()
            },
            "pg_commits_per_txn": round(self.pg_commits / self.committed, 2)
            if self.committed else 0.0,
            "pg_commits_per_s": round(self.pg_commits / self.seconds, 1) if self.seconds else 0.0,
            "node_fsyncs_per_txn": round(self.node.get("fsyncs", 0) / self.committed, 2)
            if self.committed else 0.0,
            "node_markers_per_txn": round(self.node.get("markers", 0) / self.committed, 2)
            if self.committed else 0.0,
            "load_generator_cpu_ms_per_txn": round(
                self.load_generator_s / self.committed * 1000, 3
            ) if self.committed else 0.0,
            "machine_busy": round(self.busy, 3),
            "retries": self.retries,
        }


def _port(url: str) -> int:
    return int(urlsplit(url).port or 80)


class Cluster:
    """One node and ``instances`` coordinators on a fresh database."""

    def __init__(self, work: Path, dbname: str, instances: int) -> None:
        self.dbname = dbname
        self.local = LocalCluster(bench_plan(work, dbname, coordinators=instances))
        self.node = self.local.node(1)
        self.shares: list[int] = []

    def start(self) -> Cluster:
        self.local.start()
        first = self.local.coordinators[0].url
        httpx.post(f"{first}/v1/topics", json={"name": TOPIC, "partitions": TOPIC_PARTITIONS},
                   timeout=30).raise_for_status()  # fmt: skip
        self.wait_balanced()
        return self

    def owned(self) -> list[int]:
        counts = []
        for c in self.local.coordinators:
            text = httpx.get(f"{c.url}/metrics", timeout=5).text
            line = next((ln for ln in text.splitlines()
                         if ln.startswith("eos_coordinator_owned_log_partitions ")), "x -1")
            counts.append(int(float(line.split()[1])))
        return counts

    def wait_balanced(self, timeout: float = 60.0) -> None:
        """Until the instances hold every log partition, each an even share (a cluster
        without lease balancing is left as it is after the instances' first rounds)."""
        n = len(self.local.coordinators)
        low, high = LOG_PARTITIONS // n, -(-LOG_PARTITIONS // n)
        deadline = time.monotonic() + timeout
        last, still_since = None, time.monotonic()
        while time.monotonic() < deadline:
            counts = self.owned()
            if sum(counts) == LOG_PARTITIONS and all(low <= c <= high for c in counts):
                break
            if counts != last:
                last, still_since = counts, time.monotonic()
            elif sum(counts) == LOG_PARTITIONS and time.monotonic() - still_since > 5:
                break  # every partition owned and nothing moving: as balanced as it gets
            time.sleep(0.2)
        self.shares = self.owned()

    def owner_port(self, tid: str) -> int:
        first = self.local.coordinators[0].url
        for _ in range(200):
            answer = httpx.get(f"{first}/v1/coordinators", params={"key": tid}, timeout=10)
            if answer.status_code == 200:
                return _port(answer.json()["url"])
            time.sleep(0.05)
        raise HttpError(f"no coordinator for {tid}")

    def node_counters(self) -> dict[str, float]:
        """The node's fsyncs (every partition) and markers written so far."""
        text = httpx.get(f"{self.node.url}/metrics", timeout=10).text
        found = {"fsyncs": 0.0, "markers": 0.0}
        for line in text.splitlines():
            if line.startswith("eos_node_fsyncs{"):
                found["fsyncs"] += float(line.rsplit(" ", 1)[1])
            elif line.startswith("eos_node_markers_total"):
                found["markers"] += float(line.rsplit(" ", 1)[1])
        return found

    def pids(self) -> dict[str, int]:
        found = {}
        for i, c in enumerate(self.local.coordinators):
            assert c.process is not None
            found[f"coordinator-{i}"] = c.process.pid
        assert self.node.process is not None
        found["node"] = self.node.process.pid
        return found

    def stop(self) -> None:
        self.local.stop()


async def _call(conn: Conn, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    status, answer = await conn.request("POST", path, orjson.dumps(body))
    if status != 200:
        raise HttpError(f"{what}: {status} {answer[:300]!r}")
    result: dict[str, Any] = orjson.loads(answer)
    return result


async def producer_loop(
    index: int, cluster: Cluster, run: ScaleRun, stop_at: list[float], window: list[bool]
) -> None:
    tid = f"scale-{run.instances}-{run.producers}-{run.flow}-{index}"
    coord = await Conn(await asyncio.to_thread(cluster.owner_port, tid)).open()
    node = await Conn(cluster.node.port).open()
    v2 = run.flow == "v2"
    try:
        init: dict[str, Any] = {"transaction_timeout_ms": 600_000}
        if v2:
            init["transaction_version"] = 2
        got = await _call(coord, f"/v1/transactions/{tid}/init", init, "init")
        ident = {"producer_id": got["producer_id"], "producer_epoch": got["producer_epoch"]}
        partition = index % TOPIC_PARTITIONS
        seq = 0
        while time.monotonic() < stop_at[0]:
            if not v2:
                add = {**ident, "partitions": [{"topic": TOPIC, "partition": partition}]}
                while True:
                    status, answer = await coord.request(
                        "POST", f"/v1/transactions/{tid}/partitions", orjson.dumps(add)
                    )
                    if status != 503:
                        break
                    run.retries += 1
                    await asyncio.sleep(0.002)
                if status != 200:
                    raise HttpError(f"add {tid}: {status} {answer[:300]!r}")
            body = {**ident, "base_sequence": seq, "transactional": True,
                    "records": [{"value": VALUE}]}  # fmt: skip
            await _call(node, f"/v1/partitions/{TOPIC}/{partition}/records", body, "produce")
            seq += 1
            end = await _call(coord, f"/v1/transactions/{tid}/commit",
                              {**ident, "wait_for_markers": True}, "commit")  # fmt: skip
            if v2 and end.get("producer_epoch") is not None:
                ident = {"producer_id": end["producer_id"], "producer_epoch": end["producer_epoch"]}
                seq = 0
            if window[0]:
                run.committed += 1
    finally:
        await coord.close()
        await node.close()


async def measure(cluster: Cluster, run: ScaleRun, warmup_s: float, seconds: float) -> ScaleRun:
    stop_at, window = [time.monotonic() + warmup_s + seconds + 120], [False]
    tasks = [asyncio.create_task(producer_loop(i, cluster, run, stop_at, window))
             for i in range(run.producers)]  # fmt: skip
    await asyncio.sleep(warmup_s)
    failed = [t for t in tasks if t.done() and t.exception() is not None]
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    pids = cluster.pids()
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    pg0, (xact0, _rows0) = postgres_seconds(), pg_stats(cluster.dbname)
    node0 = cluster.node_counters()
    (busy0, total0), mine0 = machine_busy_seconds(), time.process_time()
    t0 = time.monotonic()
    window[0] = True
    await asyncio.sleep(seconds)
    window[0] = False
    run.seconds = time.monotonic() - t0
    for name, pid in pids.items():
        run.cpu_s[name] = cpu_seconds(pid) - cpu0[name]
    run.cpu_s["postgres"] = postgres_seconds() - pg0
    run.load_generator_s = time.process_time() - mine0
    busy1, total1 = machine_busy_seconds()
    run.busy = (busy1 - busy0) / max(total1 - total0, 1e-9)
    run.pg_commits = pg_stats(cluster.dbname)[0] - xact0
    node1 = cluster.node_counters()
    run.node = {k: node1[k] - node0[k] for k in node0}
    stop_at[0] = 0.0
    await asyncio.gather(*tasks)
    return run


async def run_scale(
    instances: tuple[int, ...],
    producers: tuple[int, ...],
    flows: tuple[str, ...],
    seconds: float,
    progress: Any,
) -> dict[str, Any]:
    """Every (instances, producers, flow) figure, a fresh cluster per instance count."""
    runs: list[dict[str, Any]] = []
    for count in instances:
        work = Path(tempfile.mkdtemp(prefix="eos-bench-scale-"))
        try:
            with pg_database("eos_scale") as dbname:
                cluster = Cluster(work, dbname, count)
                try:
                    progress(f"scale: {count} coordinator instance(s), waiting for the leases")
                    await asyncio.to_thread(cluster.start)
                    for flow in flows:
                        for n in producers:
                            progress(f"scale: {count} instance(s), {n} producers, flow {flow}")
                            run = ScaleRun(count, n, flow, shares=cluster.shares)
                            run = await measure(cluster, run, 1.5, seconds)
                            runs.append(run.summary())
                finally:
                    cluster.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "speedup": speedups(runs)}


def speedups(runs: list[dict[str, Any]]) -> dict[str, float]:
    """txn/s with K instances over txn/s with one, per producers and flow."""
    one = {(r["producers"], r["flow"]): r["txn_per_s"] for r in runs if r["instances"] == 1}
    out: dict[str, float] = {}
    for r in runs:
        base = one.get((r["producers"], r["flow"]))
        if r["instances"] > 1 and base:
            key = f"{r['instances']}/1@{r['producers']}:{r['flow']}"
            out[key] = round(r["txn_per_s"] / base, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="1,2,4")
    parser.add_argument("--producers", default="32,128")
    parser.add_argument("--flow", default="v2", help="v1, v2 or v1,v2")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x)

    def progress(step: str) -> None:
        print(f"... {step}", file=sys.stderr, flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        result = uvloop.run(run_scale(
            ints(args.instances), ints(args.producers), tuple(args.flow.split(",")),
            args.seconds, progress,
        ))  # fmt: skip
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":  # pragma: no cover - run by hand or by eos bench
    main()
