"""The storage-node parts of ``eos bench``, built on ``bench/bench_node.py``:

* produce throughput (8 idempotent clients, 1,000-record durable batches) against the
  no-op FastAPI server parsing the same bodies and raw append+fsync of the same frames;
* read_committed fetch throughput at three log lengths, against a no-op server answering
  a canned body of the same size;
* restart time (process start until ``/readyz``) at three log lengths, against the start
  of a node with an empty data directory;
* produce at three records-per-request sizes, so the cost per record can be read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from pathlib import Path
from typing import Any

from eos_bench import bench_node
from eos_bench.bench_node import (
    CLIENTS,
    FULL,
    QUICK,
    RECORDS_PER_BATCH,
    bench_fetch,
    bench_noop,
    bench_produce,
    bench_restart,
    empty_start,
    make_values,
    node,
)
from eos_bench.fsync_limit import FsyncResult, raw_fsync_group, raw_fsync_single, sample_frame
from eos_bench.harness import free_port
from eos_bench.load import LoadResult


def load_json(lr: LoadResult) -> dict[str, Any]:
    return {
        "records_per_s": round(lr.records_per_s),
        "mb_per_s": round(lr.mb_per_s, 2),
        "requests": lr.requests,
        "p50_ms": round(lr.latency_ms(0.5), 2),
        "p90_ms": round(lr.latency_ms(0.9), 2),
        "p99_ms": round(lr.latency_ms(0.99), 2),
        "server_cpu": round(lr.server_cpu, 3),
        "client_cpu": round(lr.client_cpu, 3),
    }


def fsync_json(fr: FsyncResult) -> dict[str, Any]:
    return {
        "records_per_s": round(fr.records_per_s),
        "mb_per_s": round(fr.mb_per_s, 2),
        "frames": fr.frames,
        "fsyncs": fr.fsyncs,
    }


async def produce_at_batch_size(tmp: Path, batch: int, plan: bench_node.Plan) -> dict[str, Any]:
    """Produce with ``batch`` records per request on a fresh node. bench_node reads its
    batch size from a module constant, which is swapped for the duration of the run."""
    saved = bench_node.RECORDS_PER_BATCH
    bench_node.RECORDS_PER_BATCH = batch
    port = free_port()
    server = node(tmp / f"node-batch-{batch}", port)
    server.start()
    try:
        result, fsyncs = await bench_produce(port, server.pid, plan)
    finally:
        server.stop()
        bench_node.RECORDS_PER_BATCH = saved
        shutil.rmtree(tmp / f"node-batch-{batch}", ignore_errors=True)
    return {"records_per_request": batch, **load_json(result), "fsyncs": fsyncs}


async def fetch_at_log_length(tmp: Path, records: int, plan: bench_node.Plan) -> dict[str, Any]:
    port = free_port()
    server = node(tmp / f"node-fetch-{records}", port)
    server.start()
    try:
        result, end = await bench_fetch(
            port, server.pid, dataclasses.replace(plan, fetch_fill_records=records)
        )
    finally:
        server.stop()
        shutil.rmtree(tmp / f"node-fetch-{records}", ignore_errors=True)
    return {"log_records": end, **load_json(result)}


def node_plan(quick: bool, produce_s: float, fetch_s: float) -> bench_node.Plan:
    base = QUICK if quick else FULL
    return dataclasses.replace(
        base,
        produce_warmup_s=1.0,
        produce_s=produce_s,
        fetch_s=fetch_s,
        noop_s=produce_s,
        fsync_s=min(produce_s, 4.0),
    )


async def run_node(plan: Any, tmp: Path, progress: Any) -> dict[str, Any]:
    """Every storage-node figure of the suite plan (see ``bench/suite.py``)."""
    np = node_plan(plan.quick, plan.node_s, plan.fetch_s)
    out: dict[str, Any] = {}

    progress("node: produce")
    port = free_port()
    server = node(tmp / "node", port)
    server.start()
    try:
        produce, fsyncs = await bench_produce(port, server.pid, np)
    finally:
        server.stop()
    shutil.rmtree(tmp / "node", ignore_errors=True)
    out["produce"] = {**load_json(produce), "fsyncs": fsyncs,
                      "records_per_request": RECORDS_PER_BATCH, "clients": CLIENTS}

    out["produce_by_batch"] = []
    for batch in plan.node_batches:
        progress(f"node: produce, {batch} records per request")
        out["produce_by_batch"].append(await produce_at_batch_size(tmp, batch, np))

    out["fetch_by_log"] = []
    for records in plan.fetch_logs:
        progress(f"node: read_committed fetch over {records:,} records")
        out["fetch_by_log"].append(await fetch_at_log_length(tmp, records, np))
    out["fetch"] = out["fetch_by_log"][-1]

    out["restart"] = []
    for size in plan.restart_sizes:
        progress(f"node: restart with {size:,} records")
        r = await bench_restart(tmp, size, plan.restart_repeats)
        out["restart"].append({
            "records": r.records, "clean_stop_s": round(r.clean_s, 4),
            "sigkill_s": round(r.kill_s, 4), "sigkill_tail_records": r.kill_replayed,
            "recovery_clean_s": round(r.clean_open_s, 4),
            "recovery_sigkill_s": round(r.kill_open_s, 4),
        })

    progress("limits: empty node start, no-op FastAPI, raw append+fsync")
    limits: dict[str, Any] = {"empty_start_s": round(await empty_start(tmp, 3), 4)}
    noop = await bench_noop(np, tmp)
    limits["noop_produce_typed"] = load_json(noop["typed"])
    limits["noop_produce_validate_json"] = load_json(noop["raw"])
    limits["noop_fetch"] = load_json(noop["fetch"])
    frame = sample_frame(make_values(RECORDS_PER_BATCH, 0))
    single = await asyncio.to_thread(raw_fsync_single, tmp / "raw-1.log", frame, np.fsync_s)
    group = await asyncio.to_thread(raw_fsync_group, tmp / "raw-8.log", frame, np.fsync_s, CLIENTS)
    limits["fsync_single_writer"] = fsync_json(single)
    limits["fsync_group_8_writers"] = fsync_json(group)
    out["limits"] = limits
    return out


def node_ratios(res: dict[str, Any]) -> dict[str, float]:
    """Each node figure over its limit (the higher of the variants of that limit)."""
    limits = res["limits"]
    http = max(limits["noop_produce_typed"]["records_per_s"],
               limits["noop_produce_validate_json"]["records_per_s"])
    disk = max(limits["fsync_single_writer"]["records_per_s"],
               limits["fsync_group_8_writers"]["records_per_s"])
    produce = res["produce"]["records_per_s"]
    slowest = max(max(r["clean_stop_s"], r["sigkill_s"]) for r in res["restart"])
    return {
        "produce/noop_http": produce / http if http else 0.0,
        "produce/append_fsync": produce / disk if disk else 0.0,
        "fetch/noop_http": res["fetch"]["records_per_s"]
        / max(1, limits["noop_fetch"]["records_per_s"]),
        "restart/empty_start": slowest / max(1e-9, limits["empty_start_s"]),
    }
