"""The coordinator parts of ``eos bench``: committed transactions per second at several
concurrencies, how that cost grows with records and partitions per transaction and with
transactions left open, PostgreSQL's one-row-update limit at the same concurrency, and the
end-to-end latency from ``commit_transaction()`` returning to a read_committed consumer
seeing the records.

The services run as processes on a throw-away PostgreSQL database (one storage node, one
coordinator); the load comes from this process through the keep-alive client of
``bench/harness.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from eos_bench.bench_coordinator import (
    PG,
    admin,
    machine_busy_seconds,
    percentile_ms,
    pg_limit,
    pg_stats,
)
from eos_bench.harness import TOKEN, Conn, HttpError, cpu_seconds
from eos_cli.launcher import ClusterPlan, LocalCluster
from sdk import AsyncTransactionalProducer

TOPIC = "bench"
TOPIC_PARTITIONS = 16
E2E_TOPIC = "bench-e2e"
PG_MAX_CLIENTS = 80  # max_connections is 100 on a default server; keep room for the services


@dataclass
class TxnRun:
    producers: int
    records_per_txn: int
    partitions_per_txn: int
    open_txns: int
    committed: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    concurrent: bool = True  # a transaction's batches sent at once, one per partition
    steps: dict[str, list[float]] = field(
        default_factory=lambda: {"add": [], "produce": [], "commit": []}
    )

    @property
    def txn_per_s(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "producers": self.producers,
            "records_per_txn": self.records_per_txn,
            "partitions_per_txn": self.partitions_per_txn,
            "open_txns": self.open_txns,
            "committed": self.committed,
            "txn_per_s": round(self.txn_per_s, 1),
            "p50_ms": round(percentile_ms(self.latencies, 0.5), 2),
            "p90_ms": round(percentile_ms(self.latencies, 0.9), 2),
            "p99_ms": round(percentile_ms(self.latencies, 0.99), 2),
            "cpu": {k: round(v, 3) for k, v in self.cpu.items()},
            "retries": self.retries,
            "concurrent_sends": self.concurrent,
            "steps_p50_ms": {
                name: round(percentile_ms(v, 0.5), 2) for name, v in self.steps.items()
            },
        }


@contextlib.contextmanager
def pg_database(prefix: str = "eos_bench") -> Iterator[str]:
    """A new PostgreSQL database, dropped on the way out; yields its name."""
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield dbname
    finally:
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def db_url(dbname: str) -> str:
    return f"postgresql+psycopg://{PG['user']}@{PG['host']}:{PG['port']}/{dbname}"


def bench_plan(work: Path, dbname: str, coordinators: int = 1, **options: Any) -> ClusterPlan:
    """One storage node and ``coordinators`` coordinators on database ``dbname``, on free
    ports: the launcher's plan, as ``eos up`` runs it."""
    return ClusterPlan(
        data_dir=work, nodes=1, coordinators=coordinators, port_base=None,
        database_url=db_url(dbname), token=TOKEN, group_offset_partitions=5,
        own_session=False, **options,
    )  # fmt: skip


class Services:
    """One node and one coordinator on a new PostgreSQL database."""

    def __init__(self, work: Path, dbname: str) -> None:
        self.dbname = dbname
        self.cluster = LocalCluster(bench_plan(work, dbname))
        self.node, self.coordinator = self.cluster.node(1), self.cluster.coordinators[0]
        self.coord_port, self.node_port = self.coordinator.port, self.node.port

    def start(self) -> Services:
        self.cluster.start()
        for name, count in ((TOPIC, TOPIC_PARTITIONS), (E2E_TOPIC, 1)):
            httpx.post(
                f"{self.coordinator.url}/v1/topics",
                json={"name": name, "partitions": count},
                timeout=30,
            ).raise_for_status()
        return self

    def pids(self) -> dict[str, int]:
        assert self.node.process is not None and self.coordinator.process is not None
        return {"coordinator": self.coordinator.process.pid, "node": self.node.process.pid}

    def stop(self) -> None:
        self.cluster.stop()


# -- one transactional producer ---------------------------------------------------------------
async def init_producer(coord: Conn, tid: str, timeout_ms: int = 600_000) -> dict[str, int]:
    body = orjson.dumps({"transaction_timeout_ms": timeout_ms})
    status, answer = await coord.request("POST", f"/v1/transactions/{tid}/init", body)
    if status != 200:
        raise HttpError(f"init {tid}: {status} {answer[:300]!r}")
    got = orjson.loads(answer)
    return {"producer_id": got["producer_id"], "producer_epoch": got["producer_epoch"]}


async def open_transaction(
    coord: Conn, nodes: list[Conn], tid: str, ident: dict[str, int], parts: list[int],
    seqs: list[int], records: int, *, concurrent: bool = True,
) -> float:
    """AddPartitions (retried while the previous markers are on their way), then one batch
    of ``records`` 100-byte records to each partition: all at once, one connection per
    partition, as the SDK sends (``concurrent``), or one after the other on one connection.
    Returns the time the AddPartitions took."""
    add = orjson.dumps(
        {**ident, "partitions": [{"topic": TOPIC, "partition": p} for p in parts]}
    )
    began = time.monotonic()
    while True:
        status, answer = await coord.request("POST", f"/v1/transactions/{tid}/partitions", add)
        if status != 503:
            break
        RETRIES[0] += 1
        await asyncio.sleep(0.002)
    if status != 200:
        raise HttpError(f"add {tid}: {status} {answer[:300]!r}")
    added = time.monotonic() - began
    batch = orjson.dumps([{"key": f"k{i}", "value": "x" * 100} for i in range(records)])

    async def send(i: int, conn: Conn) -> None:
        head = orjson.dumps({**ident, "base_sequence": seqs[i], "transactional": True})
        body = head[:-1] + b',"records":' + batch + b"}"
        status, answer = await conn.request(
            "POST", f"/v1/partitions/{TOPIC}/{parts[i]}/records", body
        )
        if status != 200:
            raise HttpError(f"produce {tid}: {status} {answer[:300]!r}")
        seqs[i] += records

    if concurrent:
        await asyncio.gather(*(send(i, nodes[i]) for i in range(len(parts))))
    else:
        for i in range(len(parts)):
            await send(i, nodes[0])
    return added


RETRIES = [0]


async def txn_loop(
    index: int, svc: Services, run: TxnRun, stop_at: list[float], window: list[bool]
) -> None:
    coord = await Conn(svc.coord_port).open()
    nodes = [await Conn(svc.node_port).open()]
    if run.concurrent:
        nodes += [await Conn(svc.node_port).open() for _ in range(run.partitions_per_txn - 1)]
    try:
        tid = f"bench-{run.producers}-{run.records_per_txn}-{run.partitions_per_txn}-{index}"
        tid += f"-{run.open_txns}-{int(run.concurrent)}"
        ident = await init_producer(coord, tid)
        first = (index * run.partitions_per_txn) % TOPIC_PARTITIONS
        parts = [(first + k) % TOPIC_PARTITIONS for k in range(run.partitions_per_txn)]
        seqs = [0] * len(parts)
        end = orjson.dumps({**ident, "wait_for_markers": True})
        while time.monotonic() < stop_at[0]:
            began = time.monotonic()
            added = await open_transaction(
                coord, nodes, tid, ident, parts, seqs, run.records_per_txn,
                concurrent=run.concurrent,
            )
            produced = time.monotonic()
            status, answer = await coord.request("POST", f"/v1/transactions/{tid}/commit", end)
            if status != 200:
                raise HttpError(f"commit {tid}: {status} {answer[:300]!r}")
            if window[0]:
                done = time.monotonic()
                run.committed += 1
                run.latencies.append(done - began)
                run.steps["add"].append(added)
                run.steps["produce"].append(produced - began - added)
                run.steps["commit"].append(done - produced)
    finally:
        await coord.close()
        for conn in nodes:
            await conn.close()


async def measure(svc: Services, run: TxnRun, warmup_s: float, seconds: float) -> TxnRun:
    """Closed loop: ``run.producers`` producers, each add/produce/commit (CompleteCommit)."""
    stop_at, window = [time.monotonic() + warmup_s + seconds + 60], [False]
    RETRIES[0] = 0
    tasks = [
        asyncio.create_task(txn_loop(i, svc, run, stop_at, window)) for i in range(run.producers)
    ]
    await asyncio.sleep(warmup_s)
    pids = svc.pids()
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    (busy0, total0), mine0 = machine_busy_seconds(), time.process_time()
    t0 = time.monotonic()
    window[0] = True
    await asyncio.sleep(seconds)
    window[0] = False
    run.seconds = time.monotonic() - t0
    stop_at[0] = 0.0
    for name, pid in pids.items():
        run.cpu[name] = (cpu_seconds(pid) - cpu0[name]) / run.seconds
    busy1, total1 = machine_busy_seconds()
    run.cpu["load_generator"] = (time.process_time() - mine0) / run.seconds
    run.cpu["machine_busy"] = (busy1 - busy0) / max(total1 - total0, 1e-9)
    await asyncio.gather(*tasks)
    run.retries = RETRIES[0]
    return run


async def hold_open(svc: Services, count: int) -> None:
    """``count`` transactions begun (one partition, one record) and never ended."""
    coord, node = await Conn(svc.coord_port).open(), await Conn(svc.node_port).open()
    try:
        for i in range(count):
            tid = f"idle-{uuid.uuid4().hex[:6]}-{i}"
            ident = await init_producer(coord, tid)
            await open_transaction(coord, [node], tid, ident, [i % TOPIC_PARTITIONS], [0], 1)
    finally:
        await coord.close()
        await node.close()


# -- end to end: commit_transaction() returns -> visible read_committed ------------------------
async def end_to_end(svc: Services, samples: int, records: int) -> dict[str, Any]:
    """The SDK's transactional producer commits ``records`` records to one partition; a
    read_committed fetch loop on the node measures when the last of them is visible."""
    producer = AsyncTransactionalProducer(
        svc.coordinator.url, f"e2e-{records}-{uuid.uuid4().hex[:6]}", linger_ms=0
    )
    await producer.init_transactions()
    reader = await Conn(svc.node_port).open()
    # A topic of its own: the transactions left open by the growth runs hold back the last
    # stable offset of every partition of TOPIC.
    topic, partition = E2E_TOPIC, 0
    path = f"/v1/partitions/{topic}/{partition}/records?isolation_level=read_committed"
    offsets = f"/v1/partitions/{topic}/{partition}/offsets"
    latencies: list[float] = []
    try:
        for _ in range(samples):
            status, answer = await reader.request("GET", offsets)
            start = int(orjson.loads(answer)["last_stable_offset"])
            producer.begin_transaction()
            for i in range(records):
                await producer.send(topic, "x" * 100, key=f"e{i}", partition=partition)
            await producer.commit_transaction()
            returned = time.monotonic()
            while time.monotonic() - returned < 30:
                query = f"&offset={start + records - 1}&max_records=1"
                status, answer = await reader.request("GET", path + query)
                if status == 200 and b'"offset":' in answer:
                    break
            latencies.append(time.monotonic() - returned)
    finally:
        await reader.close()
        await producer.close()
    return {
        "records_per_txn": records,
        "samples": len(latencies),
        "p50_ms": round(percentile_ms(latencies, 0.5), 3),
        "p99_ms": round(percentile_ms(latencies, 0.99), 3),
        "max_ms": round(percentile_ms(latencies, 1.0), 3),
    }


# -- failover: SIGKILL the lease owner, time until the survivor commits for its id ---------
def _owner_of(url: str, tid: str) -> str | None:
    answer = httpx.get(f"{url}/v1/coordinators", params={"key": tid}, timeout=10)
    got = answer.json().get("url") if answer.status_code == 200 else None
    return str(got) if got else None


def _commit_one(client: httpx.Client, coord: str, node: str, tid: str) -> None:
    """init, add one partition, produce one record, commit (CompleteCommit)."""
    answer = client.post(f"{coord}/v1/transactions/{tid}/init", json={})
    answer.raise_for_status()
    ident = {k: answer.json()[k] for k in ("producer_id", "producer_epoch")}
    client.post(
        f"{coord}/v1/transactions/{tid}/partitions",
        json={**ident, "partitions": [{"topic": TOPIC, "partition": 0}]},
    ).raise_for_status()
    client.post(
        f"{node}/v1/partitions/{TOPIC}/0/records",
        json={**ident, "base_sequence": 0, "transactional": True,
              "records": [{"key": "f", "value": "failover"}]},
    ).raise_for_status()
    client.post(
        f"{coord}/v1/transactions/{tid}/commit", json={**ident, "wait_for_markers": True}
    ).raise_for_status()


def failover(lease_ms: int) -> dict[str, Any]:
    """Two coordinators on one PostgreSQL database; the owner of a transactional id is
    SIGKILLed and the survivor is asked, in a loop, to run a transaction for that id."""
    work = Path(tempfile.mkdtemp(prefix="eos-bench-failover-"))
    lease = ("--lease-ms", str(lease_ms))
    try:
        with pg_database("eos_failover") as dbname:
            plan = bench_plan(work, dbname, coordinators=2, coordinator_flags=lease)
            plan.verify_with = {1: plan.coordinator_urls[1]}
            cluster = LocalCluster(plan)
            node_url = cluster.node(1).url
            try:
                cluster.start()
                a, b = cluster.coordinators
                with httpx.Client(timeout=30) as client:
                    client.post(
                        f"{b.url}/v1/topics", json={"name": TOPIC, "partitions": 1}
                    ).raise_for_status()
                    tid = next(
                        f"failover-{i}" for i in range(10_000)
                        if _owner_of(b.url, f"failover-{i}") == a.url
                    )
                    _commit_one(client, a.url, node_url, tid)
                    a.kill()
                    killed = time.monotonic()
                    attempts = 0
                    while True:
                        attempts += 1
                        try:
                            _commit_one(client, b.url, node_url, tid)
                            break
                        except httpx.HTTPError:
                            if time.monotonic() - killed > lease_ms / 1000 + 60:
                                raise
                            time.sleep(0.01)
                    took = time.monotonic() - killed
            finally:
                cluster.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"lease_ms": lease_ms, "seconds": round(took, 3), "attempts": attempts}


# -- the part ------------------------------------------------------------------------------------
async def run_coordinator(plan: Any, progress: Any) -> dict[str, Any]:
    """Every coordinator figure of the plan, on one set of services."""
    work = Path(tempfile.mkdtemp(prefix="eos-bench-coord-"))
    out: dict[str, Any] = {}
    try:
        with pg_database() as dbname:
            svc = Services(work, dbname).start()
            try:
                runs: list[dict[str, Any]] = []
                for producers in plan.concurrency:
                    progress(f"coordinator: {producers} producers")
                    r = await measure(svc, TxnRun(producers, 1, 1, 0), 1.0, plan.coord_s)
                    runs.append(r.summary())
                out["concurrency"] = runs
                out["records_per_txn"] = []
                for records in plan.records_per_txn:
                    progress(f"coordinator: {records} records per transaction")
                    r = await measure(svc, TxnRun(8, records, 1, 0), 1.0, plan.coord_s)
                    out["records_per_txn"].append(r.summary())
                out["partitions_per_txn"] = []
                for parts in plan.partitions_per_txn:
                    progress(f"coordinator: {parts} partitions per transaction")
                    r = await measure(svc, TxnRun(8, 1, parts, 0), 1.0, plan.coord_s)
                    out["partitions_per_txn"].append(r.summary())
                widest = max(plan.partitions_per_txn)
                progress(f"coordinator: {widest} partitions per transaction, sent one by one")
                r = await measure(
                    svc, TxnRun(8, 1, widest, 0, concurrent=False), 1.0, plan.coord_s
                )
                out["partitions_per_txn_sequential"] = r.summary()
                out["open_txns"] = []
                held = 0
                for count in plan.open_txns:
                    progress(f"coordinator: {count} transactions left open")
                    await hold_open(svc, count - held)
                    held = count
                    r = await measure(svc, TxnRun(8, 1, 1, count), 1.0, plan.coord_s)
                    out["open_txns"].append(r.summary())
                out["end_to_end"] = []
                for records in plan.records_per_txn:
                    progress(f"end to end latency: {records} records per transaction")
                    out["end_to_end"].append(await end_to_end(svc, plan.e2e_samples, records))
            finally:
                svc.stop()
            out["pg_stats"] = dict(zip(("xact_commit", "txn_row_writes"), pg_stats(dbname),
                                       strict=True))
            out["pg_limit"] = []
            for clients in plan.concurrency:
                progress(f"limit: pgbench one-row update, {clients} clients")
                with psycopg.connect(**PG, dbname=dbname, autocommit=True) as conn:  # type: ignore[arg-type]
                    conn.execute("DROP TABLE IF EXISTS bench_rows")
                used = min(clients, PG_MAX_CLIENTS)
                tps, how = pg_limit(dbname, used, plan.pg_s)
                out["pg_limit"].append({"clients": clients, "clients_used": used,
                                        "tps": round(tps, 1), "tool": how})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":  # pragma: no cover - a manual check of this part alone
    import uvloop

    from eos_bench.suite import QUICK

    sys.stdout.write(
        orjson.dumps(
            uvloop.run(run_coordinator(QUICK, lambda s: print(s, file=sys.stderr))),
            option=orjson.OPT_INDENT_2,
        ).decode()
    )
