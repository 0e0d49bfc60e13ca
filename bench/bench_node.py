"""Benchmark of one storage node against the limits of the machine it runs on.

    python -m eos_bench.bench_node [--quick] [--json]

Measures, in one run:

1. produce: 1,000-record batches of 100-byte values from 8 concurrent idempotent
   producers, acknowledged only once durable (fsync with group commit);
2. read_committed fetch over a log of committed transactions;
3. restart time (process start until ``/readyz`` answers 200) with 100,000 and 1,000,000
   records in the log, after a clean stop and after a SIGKILL;
4. the limits: a no-op FastAPI endpoint parsing the same bodies with the same pydantic
   model (and serving a canned fetch answer of the same size), raw append+fsync of the
   same frames (one writer, and 8 writers sharing fsyncs), and the start of a node with
   an empty data directory.

The node and the no-op server each run as their own process (uvicorn, one worker); the
load comes from this process through a minimal keep-alive HTTP/1.1 client on uvloop, whose
CPU use is printed so that it can be seen not to be the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from eos_bench.fsync_limit import (
    FsyncResult,
    raw_fsync_group,
    raw_fsync_single,
    sample_frame,
)
from eos_bench.harness import (
    TOKEN,
    Conn,
    HttpError,
    Server,
    bearer,
    call,
    free_port,
    metric,
)
from eos_bench.load import LoadResult, Step, drive
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import LogConfig

RECORDS_PER_BATCH = 1000
VALUE_BYTES = 100
CLIENTS = 8
FETCH_READERS = 4
FETCH_MAX_RECORDS = 5000


@dataclass(frozen=True)
class Plan:
    produce_warmup_s: float
    produce_s: float
    fetch_fill_records: int
    fetch_s: float
    noop_s: float
    fsync_s: float
    restart_sizes: tuple[int, ...]
    restart_repeats: int


FULL = Plan(2.0, 15.0, 400_000, 8.0, 6.0, 4.0, (100_000, 1_000_000), 3)
QUICK = Plan(1.0, 5.0, 100_000, 3.0, 3.0, 2.0, (100_000, 1_000_000), 3)


# -- payloads ------------------------------------------------------------------------------
def make_values(count: int, seed: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return [
        "".join(
            alphabet[(seed * 7919 + i * 31 + j * 17) % len(alphabet)] for j in range(VALUE_BYTES)
        )
        for i in range(count)
    ]


def records_json(seed: int) -> bytes:
    values = make_values(RECORDS_PER_BATCH, seed)
    return orjson.dumps([{"key": f"key-{seed}-{i:06d}", "value": v} for i, v in enumerate(values)])


def produce_body(records: bytes, producer_id: int, sequence: int, *, txn: bool = False) -> bytes:
    head = (
        f'{{"producer_id":{producer_id},"producer_epoch":0,"base_sequence":{sequence},'
        f'"transactional":{"true" if txn else "false"},"records":'
    ).encode()
    return head + records + b"}"


def node(data_dir: Path, port: int) -> Server:
    """A node with durable acks (fsync and group commit: the default)."""
    argv = [sys.executable, "-m", "partition_service", "--node-id", "1", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), "--internal-token", TOKEN]
    argv += ["--txn-verification", "off", "--log-level", "warning"]
    return Server(argv, port, data_dir.parent / f"{data_dir.name}.log")


def noop_server(port: int, tmp: Path) -> Server:
    argv = [sys.executable, "-m", "eos_bench.noop_server", "--port", str(port)]
    argv += ["--fetch-records", str(FETCH_MAX_RECORDS)]
    return Server(argv, port, tmp / "noop.log")


def produce_steps(path_of: Callable[[int], str], first_pid: int) -> list[Step]:
    """Idempotent producers: one producer id per client, sequences advancing per batch."""
    steps: list[Step] = []
    for i in range(CLIENTS):
        records = records_json(i)
        state = {"seq": 0}
        pid = first_pid + i

        async def step(
            conn: Conn,
            records: bytes = records,
            state: dict[str, int] = state,
            pid: int = pid,
            path: str = path_of(i),
        ) -> tuple[int, int]:
            body = produce_body(records, pid, state["seq"])
            status, answer = await conn.request("POST", path, body)
            if status != 200:
                raise HttpError(f"produce: {status} {answer[:300]!r}")
            state["seq"] += RECORDS_PER_BATCH
            return RECORDS_PER_BATCH, len(body)

        steps.append(step)
    return steps


# -- 1. produce ------------------------------------------------------------------------------
async def bench_produce(port: int, pid: int, plan: Plan) -> tuple[LoadResult, int]:
    await call(port, "PUT", "/internal/v1/partitions/bench/0", internal=True)
    labels = 'partition="0",topic="bench"'
    fsyncs: dict[bool, float] = {}

    async def on_window(opening: bool) -> None:
        fsyncs[opening] = await metric(port, "eos_node_fsyncs", labels)

    result = await drive(
        port,
        pid,
        produce_steps(lambda _i: "/v1/partitions/bench/0/records", 1000),
        plan.produce_warmup_s,
        plan.produce_s,
        on_window,
    )
    return result, int(fsyncs[False] - fsyncs[True])


# -- 2. read_committed fetch -------------------------------------------------------------------
async def fill_transactions(port: int, topic: str, records: int) -> int:
    """Committed transactions of 5 batches each from 8 producers; returns the log end."""
    await call(port, "PUT", f"/internal/v1/partitions/{topic}/0", internal=True)
    batches_each = max(1, records // RECORDS_PER_BATCH // CLIENTS)
    path = f"/v1/partitions/{topic}/0/records"

    async def producer(i: int) -> None:
        pid, seq = 50_000 + i, 0
        body_records = records_json(100 + i)
        conn = await Conn(port).open()
        try:
            for n in range(batches_each):
                body = produce_body(body_records, pid, seq, txn=True)
                status, answer = await conn.request("POST", path, body)
                if status != 200:
                    raise HttpError(f"txn produce: {status} {answer[:300]!r}")
                seq += RECORDS_PER_BATCH
                if n % 5 == 4 or n == batches_each - 1:
                    marker = {
                        "producer_id": pid,
                        "producer_epoch": 0,
                        "coordinator_epoch": 0,
                        "result": "COMMIT",
                        "partitions": [{"topic": topic, "partition": 0}],
                    }
                    status, answer = await conn.request(
                        "POST",
                        "/internal/v1/markers",
                        orjson.dumps({"markers": [marker]}),
                        bearer(TOKEN),
                    )
                    if status != 200 or b'"error":null' not in answer:
                        raise HttpError(f"marker: {status} {answer[:300]!r}")
        finally:
            await conn.close()

    await asyncio.gather(*(producer(i) for i in range(CLIENTS)))
    offsets = await call(port, "GET", f"/v1/partitions/{topic}/0/offsets")
    if offsets["last_stable_offset"] != offsets["high_watermark"]:
        raise HttpError(f"transactions left open: {offsets}")
    return int(offsets["high_watermark"])


def fetch_steps(path: str, end: int, readers: int, *, check: bool) -> list[Step]:
    steps: list[Step] = []
    for i in range(readers):
        state = {"offset": (end // readers) * i}

        async def step(conn: Conn, state: dict[str, int] = state) -> tuple[int, int]:
            query = f"?offset={state['offset']}&max_records={FETCH_MAX_RECORDS}"
            status, answer = await conn.request(
                "GET", path + query + "&isolation_level=read_committed"
            )
            if status != 200:
                raise HttpError(f"fetch: {status} {answer[:300]!r}")
            # Counted without decoding the whole answer: the client must not be the limit.
            count = answer.count(b'"offset":')
            if check:
                at = answer.rindex(b'"next_offset":') + len(b'"next_offset":')
                next_offset = int(answer[at : answer.index(b",", at)])
                state["offset"] = 0 if next_offset >= end else next_offset
                if count == 0 and next_offset < end:
                    raise HttpError(f"empty fetch at {state['offset']}")
            return count, len(answer)

        steps.append(step)
    return steps


async def bench_fetch(port: int, pid: int, plan: Plan) -> tuple[LoadResult, int]:
    end = await fill_transactions(port, "fetch", plan.fetch_fill_records)
    path = "/v1/partitions/fetch/0/records"
    # One full decode to check the shape of what is counted.
    sample = await call(
        port, "GET", path + "?offset=0&max_records=10&isolation_level=read_committed"
    )
    assert len(sample["records"]) == 10 and sample["records"][0]["offset"] == 0, sample
    result = await drive(
        port, pid, fetch_steps(path, end, FETCH_READERS, check=True), 0.5, plan.fetch_s
    )
    return result, end


# -- 3. restart ------------------------------------------------------------------------------
def write_log_offline(directory: Path, records: int) -> None:
    """Write ``records`` records as 1,000-record idempotent batches through the log engine,
    as a node would have written them, and checkpoint like a clean stop."""
    engine = PartitionEngine(directory, "restart", 0, LogConfig())
    engine.open()
    now = int(time.time() * 1000)
    rows_by_client = []
    for i in range(CLIENTS):
        values = make_values(RECORDS_PER_BATCH, 200 + i)
        rows_by_client.append([(f"key-{i}-{n:06d}", v, None, now) for n, v in enumerate(values)])
    for n in range(records // RECORDS_PER_BATCH):
        client = n % CLIENTS
        engine.append_data(
            rows_by_client[client],
            now_ms=now,
            producer_id=70_000 + client,
            producer_epoch=0,
            base_sequence=(n // CLIENTS) * RECORDS_PER_BATCH,
        )
    engine.fsync()
    engine.mark_durable(engine.log_end_offset)
    engine.write_checkpoint(engine.capture_checkpoint())
    engine.close()


@dataclass
class RestartResult:
    records: int
    clean_s: float
    kill_s: float
    kill_replayed: int  # records the SIGKILLed node had written after its last checkpoint
    clean_open_s: float  # recovery alone: PartitionEngine.open() in this process
    kill_open_s: float


def engine_open_seconds(directory: Path) -> float:
    engine = PartitionEngine(directory, "restart", 0, LogConfig())
    started = time.monotonic()
    engine.open()
    elapsed = time.monotonic() - started
    engine.close()
    return elapsed


async def produce_batches(port: int, topic: str, batches: int, first_pid: int) -> None:
    path = f"/v1/partitions/{topic}/0/records"
    steps = produce_steps(lambda _i: path, first_pid)
    conns = [await Conn(port).open() for _ in steps]
    try:
        pairs = list(zip(steps, conns, strict=True))
        for first in range(0, batches, len(pairs)):
            chunk = pairs[: min(len(pairs), batches - first)]
            await asyncio.gather(*(step(conn) for step, conn in chunk))
    finally:
        for conn in conns:
            await conn.close()


async def bench_restart(tmp: Path, records: int, repeats: int) -> RestartResult:
    data = tmp / f"restart-{records}"
    tail = 100_000  # written over HTTP before the SIGKILL, so recovery has a tail to replay
    write_log_offline(data / "restart-0", records - tail)
    port = free_port()
    server = node(data, port)
    try:
        server.start()
        await produce_batches(port, "restart", tail // RECORDS_PER_BATCH, 80_000)
        offsets = await call(port, "GET", "/v1/partitions/restart/0/offsets")
        assert offsets["high_watermark"] == records, offsets
        kills: list[float] = []
        for _ in range(repeats):
            # SIGKILL: the tail is after the last checkpoint (a recovery writes none, so
            # every repeat replays the same tail)
            server.kill()
            kills.append(server.start())
            offsets = await call(port, "GET", "/v1/partitions/restart/0/offsets")
            assert offsets["high_watermark"] == records, offsets
        server.kill()
        kill_open = engine_open_seconds(data / "restart-0")
        server.start()
        clean: list[float] = []
        for _ in range(repeats):
            server.stop()
            clean.append(server.start())
        server.stop()
        clean_open = engine_open_seconds(data / "restart-0")
    finally:
        server.kill()
    shutil.rmtree(data, ignore_errors=True)
    return RestartResult(
        records, statistics.median(clean), statistics.median(kills), tail, clean_open, kill_open
    )


async def empty_start(tmp: Path, repeats: int) -> float:
    times = []
    for i in range(repeats):
        port = free_port()
        server = node(tmp / f"empty-{i}", port)
        try:
            times.append(server.start())
        finally:
            server.stop()
    return statistics.median(times)


# -- 4. limits -------------------------------------------------------------------------------
async def bench_noop(plan: Plan, tmp: Path) -> dict[str, LoadResult]:
    port = free_port()
    server = noop_server(port, tmp)
    server.start()
    out: dict[str, LoadResult] = {}
    try:
        for kind in ("typed", "raw"):
            steps = produce_steps(lambda _i, kind=kind: f"/{kind}/bench/0/records", 1000)
            out[kind] = await drive(port, server.pid, steps, 1.0, plan.noop_s)

        async def fetch_step(conn: Conn) -> tuple[int, int]:
            status, answer = await conn.request("GET", "/fetch")
            if status != 200:
                raise HttpError(f"noop fetch: {status}")
            return answer.count(b'"offset":'), len(answer)

        out["fetch"] = await drive(
            port, server.pid, [fetch_step] * FETCH_READERS, 0.5, plan.fetch_s
        )
    finally:
        server.stop()
    return out


# -- report ----------------------------------------------------------------------------------
def ratio(value: float, limit: float) -> str:
    return f"{100 * value / limit:5.1f}%" if limit else "  n/a"


def report(res: dict[str, Any], plan: Plan, out: Any) -> None:
    p, f, n, fs, r = res["produce"], res["fetch"], res["noop"], res["fsync"], res["restart"]
    w = out.write
    w(
        f"\nEOS storage node benchmark  ({os.cpu_count()} CPUs, "
        f"{'quick' if plan is QUICK else 'full'} run)\n"
    )
    w("=" * 100 + "\n")
    w(
        f"{'measurement':<52}{'records/s':>12}{'MB/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'cpu srv/cli':>12}\n"
    )
    w("-" * 100 + "\n")

    def row(name: str, lr: LoadResult | FsyncResult, lat: bool = True, cpu: bool = True) -> None:
        p50 = f"{lr.latency_ms(0.5):9.1f}" if lat and isinstance(lr, LoadResult) else " " * 9
        p99 = f"{lr.latency_ms(0.99):9.1f}" if lat and isinstance(lr, LoadResult) else " " * 9
        c = (
            f"{lr.server_cpu:5.0%}/{lr.client_cpu:<4.0%}"
            if cpu and isinstance(lr, LoadResult)
            else ""
        )
        w(f"{name:<52}{lr.records_per_s:>12,.0f}{lr.mb_per_s:>8.1f}{p50}{p99}{c:>12}\n")

    row("1. produce, 8 clients x 1000 x 100 B, durable", p)
    w(
        f"{'     fsyncs during the window (eos_node_fsyncs)':<52}{res['produce_fsyncs']:>12,}"
        f"   = {res['produce_fsyncs'] / max(1, p.requests):.2f} per batch "
        f"({p.requests} batches)\n"
    )
    row("   limit: no-op FastAPI, typed body parameter", n["typed"])
    row("   limit: no-op FastAPI, validate_json, gc paused", n["raw"])
    row("   limit: raw append+fsync, 1 writer", fs["single"], lat=False, cpu=False)
    row(
        f"   limit: raw append+fsync, {CLIENTS} writers, shared fsync",
        fs["group"],
        lat=False,
        cpu=False,
    )
    http_limit = max(n["typed"].records_per_s, n["raw"].records_per_s)
    disk_limit = max(fs["group"].records_per_s, fs["single"].records_per_s)
    w(
        f"   produce / no-op HTTP limit: {ratio(p.records_per_s, http_limit)}    "
        f"produce / append+fsync limit: {ratio(p.records_per_s, disk_limit)}    "
        f"produce / min(limits): {ratio(p.records_per_s, min(http_limit, disk_limit))}\n"
    )
    w("-" * 100 + "\n")
    row(f"2. fetch read_committed, {FETCH_READERS} readers x {FETCH_MAX_RECORDS} records", f)
    w(f"     over {res['fetch_log_records']:,} records in committed 5-batch transactions\n")
    row("   limit: no-op FastAPI, canned answer of that size", n["fetch"])
    w(f"   fetch / no-op HTTP limit: {ratio(f.records_per_s, n['fetch'].records_per_s)}\n")
    w("-" * 100 + "\n")
    w(
        f"{'3. restart, process start -> /readyz 200':<52}{'clean stop':>12}{'SIGKILL':>12}"
        f"{'tail replayed':>16}\n"
    )
    for item in r:
        w(
            f"{'   ' + format(item.records, ',') + ' records in the log':<52}"
            f"{item.clean_s:>11.3f}s{item.kill_s:>11.3f}s{item.kill_replayed:>16,}\n"
        )
    for item in r:
        w(
            f"{'     recovery alone (engine open), ' + format(item.records, ','):<52}"
            f"{item.clean_open_s:>11.3f}s{item.kill_open_s:>11.3f}s\n"
        )
    empty = res["empty_start_s"]
    w(f"{'   limit: node start with an empty data directory':<52}{empty:>11.3f}s\n")
    worst = max(max(x.clean_s, x.kill_s) for x in r)
    w(
        f"   slowest restart / empty start: {ratio(worst, empty)}  "
        f"(log-dependent part: {1000 * (worst - empty):+.0f} ms)\n"
    )
    w("-" * 100 + "\n")
    targets = res["targets"]
    w(
        "targets: "
        + "   ".join(f"{k} {'MET' if v else 'MISSED'}" for k, v in targets.items())
        + "\n"
    )
    w(f"total bench time {res['bench_seconds']:.0f} s\n")


def to_json(res: dict[str, Any]) -> dict[str, Any]:
    def load(lr: LoadResult) -> dict[str, Any]:
        return {
            "records_per_s": round(lr.records_per_s),
            "mb_per_s": round(lr.mb_per_s, 2),
            "requests": lr.requests,
            "p50_ms": round(lr.latency_ms(0.5), 2),
            "p99_ms": round(lr.latency_ms(0.99), 2),
            "server_cpu": round(lr.server_cpu, 3),
            "client_cpu": round(lr.client_cpu, 3),
        }

    def fsync(fr: FsyncResult) -> dict[str, Any]:
        return {
            "records_per_s": round(fr.records_per_s),
            "mb_per_s": round(fr.mb_per_s, 2),
            "frames": fr.frames,
            "fsyncs": fr.fsyncs,
            "frame_bytes": fr.frame_bytes,
        }

    return {
        "produce": {**load(res["produce"]), "fsyncs": res["produce_fsyncs"]},
        "fetch_read_committed": {**load(res["fetch"]), "log_records": res["fetch_log_records"]},
        "restart": [
            {
                "records": r.records,
                "clean_stop_s": round(r.clean_s, 4),
                "sigkill_s": round(r.kill_s, 4),
                "sigkill_tail_records": r.kill_replayed,
                "recovery_clean_stop_s": round(r.clean_open_s, 4),
                "recovery_sigkill_s": round(r.kill_open_s, 4),
            }
            for r in res["restart"]
        ],
        "limits": {
            "noop_produce_typed": load(res["noop"]["typed"]),
            "noop_produce_validate_json": load(res["noop"]["raw"]),
            "noop_fetch": load(res["noop"]["fetch"]),
            "fsync_single_writer": fsync(res["fsync"]["single"]),
            "fsync_group_8_writers": fsync(res["fsync"]["group"]),
            "empty_node_start_s": round(res["empty_start_s"], 4),
        },
        "targets": res["targets"],
        "bench_seconds": round(res["bench_seconds"], 1),
    }


# -- main ------------------------------------------------------------------------------------
@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="eos-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run(plan: Plan, tmp: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    began = time.monotonic()
    res: dict[str, Any] = {}
    port = free_port()
    server = node(tmp / "node", port)
    server.start()
    try:
        progress("produce")
        res["produce"], res["produce_fsyncs"] = await bench_produce(port, server.pid, plan)
        progress("fetch")
        res["fetch"], res["fetch_log_records"] = await bench_fetch(port, server.pid, plan)
    finally:
        server.stop()
    shutil.rmtree(tmp / "node", ignore_errors=True)

    progress("restart")
    res["restart"] = [
        await bench_restart(tmp, size, plan.restart_repeats) for size in plan.restart_sizes
    ]
    res["empty_start_s"] = await empty_start(tmp, plan.restart_repeats)

    progress("limits: no-op server")
    res["noop"] = await bench_noop(plan, tmp)
    progress("limits: raw fsync")
    frame = sample_frame(make_values(RECORDS_PER_BATCH, 0))
    res["fsync"] = {
        "single": raw_fsync_single(tmp / "raw-1.log", frame, plan.fsync_s),
        "group": raw_fsync_group(tmp / "raw-8.log", frame, plan.fsync_s, CLIENTS),
    }
    res["targets"] = {
        "produce>=100k/s": res["produce"].records_per_s >= 100_000,
        "fetch>=300k/s": res["fetch"].records_per_s >= 300_000,
        "restart<1s": all(max(r.clean_s, r.kill_s) < 1.0 for r in res["restart"]),
    }
    res["bench_seconds"] = time.monotonic() - began
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (under a minute)")
    parser.add_argument("--json", action="store_true", help="print JSON (the table to stderr)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    table_out = sys.stderr if args.json else sys.stdout

    def progress(step: str) -> None:
        print(f"... {step}", file=sys.stderr, flush=True)

    with scratch() as tmp:
        res = uvloop.run(run(plan, tmp, progress))
    report(res, plan, table_out)
    if args.json:
        sys.stdout.write(orjson.dumps(to_json(res), option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
