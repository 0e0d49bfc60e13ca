"""``eos bench``: every benchmark of the product and the limits of the machine, in one run.

    eos bench [--quick] [--json] [--docs] [--only node,coordinator,failover,replication,...]
    python -m bench.suite [same options]

The parts (each also runnable alone through its own script):

* ``node`` (``bench/suite_node.py``): produce and read_committed fetch throughput, restart
  time at three log lengths; limits: no-op FastAPI, raw append+fsync, empty-node start;
* ``coordinator`` (``bench/suite_coord.py``): committed transactions per second and commit
  latency at several concurrencies, at three records- and partitions-per-transaction and
  three numbers of open transactions; end-to-end commit-to-visible latency; limit:
  PostgreSQL one-row-update transactions per second (pgbench);
* ``scale`` (``bench/suite_scale.py``): committed transactions per second with 1, 2 and 4
  coordinator instances at 32 and 128 producers, both transaction flows (the client adds
  partitions, or the node does: KIP-890 part 2), and the CPU per committed transaction
  summed over coordinators, node and PostgreSQL;
* ``failover``: SIGKILL the lease owner of two coordinators, time until the survivor commits;
* ``replication`` (``bench/suite_replication.py``): produce throughput with three replicas
  and acks=all against one, commit-to-visible latency with three, and the time from a
  partition leader's SIGKILL to the first write on its successor;
* ``auth`` (``bench/bench_auth.py``): produce and fetch on a node with authentication and
  ACLs off, then on; limit: the no-op FastAPI server;
* ``sdk`` and ``spark`` (``bench/suite_clients.py``);
* ``wide`` (``bench/suite_wide.py``): the ``eos up`` cluster with every client option at
  its default: producer and consumer throughput and the services' CPU per record, RF=3
  over RF=1, the time a 1,000-partition topic takes to become producible and the metadata
  calls meanwhile, the idle CPU of 5,000 partitions and the time to stop the cluster;
* ``groups`` (``bench/suite_groups.py``): consumer groups with the coordinator's defaults:
  the rebalance after a member's SIGKILL, a join to its first record, the coordinator's CPU
  per heartbeat of 1,000 members, and an exactly-once group copy by one member and by three.

The machine is shared with whatever else runs on it; figures are noisy, and the cheap
ones are taken as the median of several rounds.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARTS = ("node", "coordinator", "scale", "failover", "replication", "auth", "sdk", "spark",
         "wide", "groups")


@dataclass(frozen=True)
class SuitePlan:
    quick: bool
    node_s: float
    fetch_s: float
    node_batches: tuple[int, ...]
    fetch_logs: tuple[int, ...]
    restart_sizes: tuple[int, ...]
    restart_repeats: int
    replication_s: float
    replication_rounds: int
    replication_failovers: int
    concurrency: tuple[int, ...]
    coord_s: float
    records_per_txn: tuple[int, ...]
    partitions_per_txn: tuple[int, ...]
    open_txns: tuple[int, ...]
    e2e_samples: int
    pg_s: int
    lease_ms: int
    commit_intervals_ms: tuple[int, ...]
    sdk_s: float
    sdk_rounds: int
    spark_sizes: tuple[int, ...]
    scale_instances: tuple[int, ...] = (1, 2, 4)
    scale_producers: tuple[int, ...] = (32, 128)
    scale_flows: tuple[str, ...] = ("v1", "v2")
    scale_s: float = 8.0


QUICK = SuitePlan(
    quick=True,
    node_s=3.0,
    fetch_s=2.0,
    node_batches=(100, 1000, 5000),
    fetch_logs=(20_000, 100_000, 300_000),
    restart_sizes=(100_000, 1_000_000, 10_000_000),
    restart_repeats=1,
    replication_s=2.0,
    replication_rounds=1,
    replication_failovers=1,
    concurrency=(1, 8, 32, 128),
    coord_s=3.0,
    records_per_txn=(1, 100, 1000),
    partitions_per_txn=(1, 4, 16),
    open_txns=(10, 100, 1000),
    e2e_samples=30,
    pg_s=3,
    lease_ms=2000,
    commit_intervals_ms=(10, 100, 1000),
    sdk_s=2.0,
    sdk_rounds=1,
    spark_sizes=(20_000, 100_000, 300_000),
    scale_s=3.0,
)
FULL = SuitePlan(
    quick=False,
    node_s=10.0,
    fetch_s=5.0,
    node_batches=(100, 1000, 5000),
    fetch_logs=(40_000, 400_000, 1_000_000),
    restart_sizes=(100_000, 1_000_000, 10_000_000),
    restart_repeats=3,
    replication_s=4.0,
    replication_rounds=3,
    replication_failovers=3,
    concurrency=(1, 8, 32, 128),
    coord_s=10.0,
    records_per_txn=(1, 100, 1000),
    partitions_per_txn=(1, 4, 16),
    open_txns=(10, 100, 1000),
    e2e_samples=200,
    pg_s=10,
    lease_ms=2000,
    commit_intervals_ms=(10, 100, 1000),
    sdk_s=4.0,
    sdk_rounds=3,
    spark_sizes=(100_000, 500_000, 1_000_000),
)


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and the disk under the temporary directory."""
    info: dict[str, Any] = {"cores": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
        info["memory_gb"] = round(int(mem) / 1024 / 1024, 1)
    except OSError:
        pass
    tmp = tempfile.gettempdir()
    usage = shutil.disk_usage(tmp)
    info["disk"] = {"path": tmp, "total_gb": round(usage.total / 1e9, 1),
                    "device": _device_of(tmp)}
    return info


def _device_of(path: str) -> str:
    best, device = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, fstype = line.split()[:3]
            if path.startswith(mount) and len(mount) > len(best):
                best, device = mount, f"{dev} ({fstype})"
        name = device.split()[0].rsplit("/", 1)[-1]
        rotational = Path(f"/sys/block/{name}/queue/rotational")
        if rotational.exists():
            device += ", rotational" if rotational.read_text().strip() == "1" else ", SSD"
    except (OSError, ValueError, IndexError):
        pass
    return device


def ratios(res: dict[str, Any]) -> dict[str, Any]:
    """Each product figure over its limit."""
    from eos_bench.suite_node import node_ratios

    out: dict[str, Any] = {}
    if "node" in res:
        out.update(node_ratios(res["node"]))
    coord = res.get("coordinator")
    if coord and coord.get("pg_limit"):
        pg = {p["clients"]: p["tps"] for p in coord["pg_limit"]}
        for run in coord["concurrency"]:
            limit = pg.get(run["producers"]) or 0
            # three state writes per transaction: AddPartitions, PrepareCommit, CompleteCommit
            out[f"txn/pg@{run['producers']}"] = run["txn_per_s"] / limit if limit else 0.0
            out[f"state_writes/pg@{run['producers']}"] = (
                3 * run["txn_per_s"] / limit if limit else 0.0
            )
    scale = res.get("scale")
    if scale and coord and coord.get("pg_limit"):
        pg = {p["clients"]: p["tps"] for p in coord["pg_limit"]}
        for run in scale.get("runs", []):
            limit = pg.get(run["producers"]) or 0
            key = f"pg_commits/pg@{run['instances']}x{run['producers']}:{run['flow']}"
            out[key] = run["pg_commits_per_s"] / limit if limit else 0.0
    sdk = res.get("sdk")
    if sdk:
        raw = sdk["raw_httpx"]["records_per_s"] or 1
        out["sdk_idempotent/raw_httpx"] = sdk["idempotent"]["records_per_s"] / raw
        for t in sdk["transactional"]:
            out[f"sdk_txn@{t['commit_interval_ms']}ms/raw_httpx"] = t["records_per_s"] / raw
    spark = res.get("spark")
    if spark and spark.get("runs"):
        last = spark["runs"][-1]
        out["spark_exactly_once/at_least_once"] = last["ratio"]
    auth = res.get("auth")
    if auth:
        for kind in ("produce", "fetch"):
            off = auth[f"{kind}_records_per_s_auth_off"] or 1
            out[f"{kind}_auth_on/off"] = auth[f"{kind}_records_per_s_auth_on"] / off
    rep = res.get("replication")
    if rep and "rf3_over_rf1" in rep:
        out["produce_rf3/rf1"] = rep["rf3_over_rf1"]
        if rep.get("failover_max_s") is not None:
            out["leader_failover/session"] = rep["failover_max_s"] / rep["session_timeout_s"]
    wide = res.get("wide")
    if wide:
        from eos_bench.suite_wide import wide_ratios

        out.update(wide_ratios(wide))
    fo = res.get("failover")
    if fo and "seconds" in fo:
        out["failover/lease"] = fo["seconds"] / (fo["lease_ms"] / 1000)
    return {k: round(v, 4) for k, v in out.items()}


async def run_suite(
    plan: SuitePlan, progress: Callable[[str], None], parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    from eos_bench.suite_clients import run_sdk, run_spark
    from eos_bench.suite_coord import failover, run_coordinator
    from eos_bench.suite_node import run_node

    began = time.monotonic()
    res: dict[str, Any] = {"mode": "quick" if plan.quick else "full", "machine": machine(),
                           "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "timings_s": {}}
    tmp = Path(tempfile.mkdtemp(prefix="eos-bench-suite-"))
    try:
        for part in parts:
            t0 = time.monotonic()
            try:
                if part == "node":
                    res["node"] = await run_node(plan, tmp, progress)
                elif part == "coordinator":
                    res["coordinator"] = await run_coordinator(plan, progress)
                elif part == "scale":
                    from eos_bench.suite_scale import run_scale

                    res["scale"] = await run_scale(
                        plan.scale_instances, plan.scale_producers, plan.scale_flows,
                        plan.scale_s, progress,
                    )
                elif part == "failover":
                    progress("failover: SIGKILL the lease owner")
                    res["failover"] = await asyncio.to_thread(failover, plan.lease_ms)
                elif part == "replication":
                    from eos_bench.suite_replication import run_replication

                    res["replication"] = await asyncio.to_thread(
                        run_replication, plan.replication_s, plan.replication_rounds,
                        plan.e2e_samples, plan.replication_failovers, progress,
                    )  # fmt: skip
                elif part == "auth":
                    from eos_bench.bench_auth import main_async as run_auth

                    progress("auth: produce and fetch with auth off, then on")
                    res["auth"] = await run_auth(plan.fetch_s, 1 if plan.quick else 3)
                elif part == "sdk":
                    res["sdk"] = await asyncio.to_thread(run_sdk, plan, progress)
                elif part == "spark":
                    res["spark"] = await asyncio.to_thread(run_spark, plan, progress)
                elif part == "wide":
                    from eos_bench.suite_wide import FULL as WIDE_FULL
                    from eos_bench.suite_wide import QUICK as WIDE_QUICK
                    from eos_bench.suite_wide import run_wide

                    res["wide"] = await asyncio.to_thread(
                        run_wide, WIDE_QUICK if plan.quick else WIDE_FULL, progress
                    )
                elif part == "groups":
                    from eos_bench.suite_groups import run_groups

                    res["groups"] = await asyncio.to_thread(run_groups, plan.quick, progress)
            except Exception as exc:  # one broken part must not lose the others' figures
                res[part] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                progress(f"{part} FAILED: {exc!r}"[:500])
            res["timings_s"][part] = round(time.monotonic() - t0, 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["ratios"] = ratios({k: v for k, v in res.items() if not _failed(v)})
    res["bench_seconds"] = round(time.monotonic() - began, 1)
    return res


def _failed(value: Any) -> bool:
    return isinstance(value, dict) and "error" in value and len(value) == 1


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    import uvloop

    from eos_bench.suite_report import emit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--only", default=",".join(PARTS))
    args = parser.parse_args(argv)
    parts = tuple(p for p in args.only.split(",") if p)

    def progress(step: str) -> None:
        print(f"... {step}", file=sys.stderr, flush=True)

    res = uvloop.run(run_suite(QUICK if args.quick else FULL, progress, parts))
    emit(res, json_out=args.json, docs=args.docs)


if __name__ == "__main__":
    main()
