"""The throughput half of the ``wide`` part of ``eos bench`` (``bench/suite_wide.py``): what
one client with the SDK's defaults gets out of the cluster ``eos up`` starts, and what
each record costs the services in CPU.

The other parts tune their clients (``batch_size`` 256 KB, large ``max_poll_records``) to
find the services' limits; this one leaves every producer and consumer option at its
default, because those are the figures a new user meets first. Every run is one
``sdk.Producer`` (the blocking one, as a new user would write it) or one
``sdk.Consumer``; the application loop keeps at most ``HOT_WINDOW`` records
unacknowledged (as ``bench/bench_sdk_hot.py`` does), so that the final ``flush`` drains a
bounded backlog and the rate counts acknowledged records only.

The CPU of the three nodes and the coordinator is read from ``/proc`` over the same
window as the records (``harness.cpu_seconds``), so the cost per record is the services'
whole cost: leaders, followers' replication fetches, fsyncs, the coordinator's metadata.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eos_bench.bench_node import bench_noop, produce_steps
from eos_bench.bench_sdk_hot import CHUNK, HOT_BATCH_SIZE, HOT_WINDOW, VALUE_100
from eos_bench.harness import cpu_seconds
from eos_bench.load import drive
from eos_bench.suite_node import load_json, node_plan
from eos_cli.launcher import ClusterPlan, LocalCluster
from sdk import AdminClient, Consumer, Producer, TransactionalProducer

Progress = Callable[[str], None]

#: Records per transaction when the consumer's topic is filled: markers on every
#: partition now and then, so read_committed has a last stable offset to follow.
FILL_TXN_RECORDS = 100_000
#: A consumer that reads nothing for this long has stalled: the run fails instead of
#: hanging the suite.
STALL_S = 30.0


def start_cluster(root: Path) -> LocalCluster:
    """Three nodes and one coordinator as ``eos up`` plans them (its default replication
    factor of 3, SQLite, fsync on), on free ports instead of 8080 and up, so that a
    cluster a user left running is not in the way."""
    plan = ClusterPlan(root, nodes=3, coordinators=1, port_base=None,
                       default_replication_factor=3)  # fmt: skip
    return LocalCluster(plan).start()


def service_pids(cluster: LocalCluster) -> dict[str, int]:
    """``node-1`` .. ``node-3`` and ``coordinator``: the processes that serve a client."""
    pids: dict[str, int] = {}
    for service in cluster.services:
        assert service.pid is not None
        name = "coordinator" if service in cluster.coordinators else service.name
        pids[name.replace(" ", "-")] = service.pid
    return pids


class CpuWindow:
    """CPU seconds of some processes, and of this one, from its opening to ``close``; and
    the seconds this process's garbage collector ran meanwhile (the client's objects per
    record are what it walks: a third of a producer's CPU once went there)."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.mine = time.process_time()
        self.t0 = time.monotonic()
        self.seconds = 0.0
        self.cpu: dict[str, float] = {}
        self.client_cpu = 0.0
        self.client_gc = 0.0
        self._gc_began = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.client_gc += time.perf_counter() - self._gc_began

    def close(self) -> CpuWindow:
        self.seconds = time.monotonic() - self.t0
        self.cpu = {n: cpu_seconds(p) - self.start[n] for n, p in self.pids.items()}
        self.client_cpu = time.process_time() - self.mine
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        return self

    @property
    def services_cpu(self) -> float:
        return sum(self.cpu.values())

    def per_record_us(self, records: int) -> dict[str, float]:
        """Services' CPU per record (µs) in all and by process, and this process's."""
        if not records:
            return {"services": 0.0, "client": 0.0}
        out = {"services": round(self.services_cpu / records * 1e6, 2),
               "client": round(self.client_cpu / records * 1e6, 2),
               "client_gc": round(self.client_gc / records * 1e6, 2)}  # fmt: skip
        out.update({n: round(v / records * 1e6, 2) for n, v in self.cpu.items()})
        return out


def produce_rate(
    cluster: LocalCluster, topic: str, seconds: float, *, keyed: bool, many: bool
) -> dict[str, Any]:
    """Records per second acknowledged to one ``Producer(bootstrap)`` with every default,
    100 B values, distinct keys when ``keyed``; ``send`` one by one, or ``send_many``
    lists of ``CHUNK``. The window runs from the first send of the loop to the end of
    the final flush; the services' CPU is taken over the same window."""
    values = [VALUE_100] * CHUNK
    sent = 0
    singles: list[Any] = []  # every send's future
    lists: list[Any] = []  # every send_many's RecordFutures
    pending: collections.deque[Any] = collections.deque()
    with Producer(cluster.url) as producer:
        producer.send(topic, VALUE_100, key="warm" if keyed else None).result(60)
        window = CpuWindow(service_pids(cluster))
        stop = window.t0 + seconds
        while time.monotonic() < stop:
            keys = [f"key-{sent + i}" for i in range(CHUNK)] if keyed else None
            if many:
                futures = producer.send_many(topic, values, keys=keys)
                lists.append(futures)
                pending.append(futures.all_done)
            else:
                send = producer.send
                if keys is None:
                    chunk = [send(topic, VALUE_100) for _ in range(CHUNK)]
                else:
                    chunk = [send(topic, VALUE_100, key) for key in keys]
                singles.extend(chunk)
                pending.append(chunk[-1])
            sent += CHUNK
            while len(pending) * CHUNK > HOT_WINDOW:
                pending.popleft().exception()  # waits; a failure is counted below
        producer.flush()
        window.close()
    acked = sum(1 for f in singles if f.exception() is None)
    for futures in lists:
        acked += sum(1 for i in range(len(futures))
                     if not isinstance(futures.outcome(i), BaseException))  # fmt: skip
    return {
        "client": "sdk.Producer (blocking), defaults" + (", send_many" if many else ", send"),
        "keyed": keyed,
        "records_per_s": round(acked / window.seconds) if window.seconds else 0,
        "acknowledged": acked,
        "failed": sent - acked,
        "seconds": round(window.seconds, 2),
        "cpu_us_per_record": window.per_record_us(acked),
    }


def fill(cluster: LocalCluster, topic: str, partitions: int, records: int) -> float:
    """Write ``records`` 100 B records spread evenly over the topic's partitions, in
    transactions of ``FILL_TXN_RECORDS`` (the fill is not measured, so its producer is
    tuned for speed: 256 KB batches, ``send_many`` per partition). Returns the seconds."""
    began = time.monotonic()
    per_txn = min(records, FILL_TXN_RECORDS)
    share = max(1, per_txn // partitions)
    values = [VALUE_100] * share
    producer = TransactionalProducer(cluster.url, f"wide-fill-{uuid.uuid4().hex[:8]}",
                                     batch_size=HOT_BATCH_SIZE)  # fmt: skip
    try:
        producer.init_transactions()
        left = records
        while left > 0:
            producer.begin_transaction()
            for p in range(partitions):
                n = min(share, left)
                if n <= 0:
                    break
                producer.send_many(topic, values[:n], partition=p)
                left -= n
            producer.commit_transaction()
    finally:
        producer.close()
    return time.monotonic() - began


def consume_rate(
    cluster: LocalCluster, topic: str, partitions: int, records: int
) -> dict[str, Any]:
    """One ``Consumer(bootstrap)`` with every default (read_committed, 500 records a
    poll): from ``assign`` and ``seek`` to 0 on every partition until it has read
    ``records``."""
    got = 0
    window = CpuWindow(service_pids(cluster))
    with Consumer(cluster.url) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.seek((topic, p), 0)
        last_progress = time.monotonic()
        while got < records:
            n = len(consumer.poll(timeout=1.0))
            got += n
            if n:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_S:
                raise TimeoutError(f"consumer stalled at {got:,} of {records:,} records")
    window.close()
    return {
        "client": "sdk.Consumer (blocking), defaults, read_committed",
        "partitions": partitions,
        "records": got,
        "records_per_s": round(got / window.seconds) if window.seconds else 0,
        "seconds": round(window.seconds, 2),
        "cpu_us_per_record": window.per_record_us(got),
    }


def node_accept_limit(cluster: LocalCluster, topic: str, seconds: float) -> dict[str, Any]:
    """What the leader of ``topic``'s partition 0 (RF=3, acks=all) accepts from 8
    connections posting 1,000-record batches of 100 B with the services' keep-alive
    client, no SDK (``bench_node.produce_steps``): the cluster's own limit for one
    partition, next to which the SDK's figures are read. Producer ids are made up far
    from the coordinator's."""
    with AdminClient(cluster.url) as admin:
        leader = admin.describe_topic(topic).partitions[0].leader.node_id
    node = cluster.node(leader)
    assert node.pid is not None
    first_pid = 900_000_000 + (uuid.uuid4().int % 1_000_000) * 10
    steps = produce_steps(lambda _i: f"/v1/partitions/{topic}/0/records", first_pid)
    result = asyncio.run(drive(node.port, node.pid, steps, 1.0, seconds))
    out = load_json(result)
    out["leader_cpu_us_per_record"] = round(
        result.server_cpu * result.seconds / max(1, result.records) * 1e6, 2
    )
    return out


def noop_limits(quick: bool, seconds: float, tmp: Path) -> dict[str, Any]:
    """The no-op FastAPI server's produce (typed body) and canned-fetch rates and its CPU
    per record: the machine's HTTP limit, measured by ``bench_node.bench_noop``."""
    plan = dataclasses.replace(node_plan(quick, seconds, seconds), noop_s=seconds)
    noop = asyncio.run(bench_noop(plan, tmp))
    out: dict[str, Any] = {}
    for key, name in (("typed", "noop_produce_typed"), ("raw", "noop_produce_validate_json"),
                      ("fetch", "noop_fetch")):  # fmt: skip
        lr = noop[key]
        out[name] = load_json(lr)
        out[name]["server_cpu_us_per_record"] = round(
            lr.server_cpu * lr.seconds / max(1, lr.records) * 1e6, 2
        )
    return out


def run_clients(plan: Any, root: Path, progress: Progress) -> dict[str, Any]:
    """Every throughput figure of the ``wide`` part on one cluster (``plan`` is
    ``suite_wide.WidePlan``), then the no-op server's limits with the cluster stopped."""
    out: dict[str, Any] = {}
    cluster = start_cluster(root / "throughput")
    try:
        with AdminClient(cluster.url) as admin:
            admin.create_topic("w3", 3)  # the coordinator's default RF (3, as eos up sets)
            admin.create_topic("w3-many", 3)
            admin.create_topic("w100", 100)
            admin.create_topic("w3-rf1", 3, replication_factor=1)
            admin.create_topic("limit", 1)
            admin.create_topic("consume", plan.consume_partitions)
            out["replication_factor"] = admin.describe_topic("w3").replication_factor
        s = plan.produce_s
        progress(f"wide: Producer defaults, keyed, 3 partitions RF=3 ({s:g} s)")
        out["keyed_3"] = produce_rate(cluster, "w3", s, keyed=True, many=False)
        progress(f"wide: Producer defaults, keyless, 3 partitions RF=3 ({s:g} s)")
        out["keyless_3"] = produce_rate(cluster, "w3", s, keyed=False, many=False)
        progress(f"wide: Producer defaults, keyed, 100 partitions RF=3 ({s:g} s)")
        out["keyed_100"] = produce_rate(cluster, "w100", s, keyed=True, many=False)
        progress(f"wide: Producer.send_many defaults, keyed, 3 partitions RF=3 ({s:g} s)")
        out["send_many_keyed_3"] = produce_rate(cluster, "w3-many", s, keyed=True, many=True)
        progress(f"wide: Producer defaults, keyed, 3 partitions RF=1 ({s:g} s)")
        out["keyed_3_rf1"] = produce_rate(cluster, "w3-rf1", s, keyed=True, many=False)
        progress(f"wide: limit: node accept, 8 x 1000-record batches, RF=3 ({plan.limit_s:g} s)")
        out["node_accept_limit"] = node_accept_limit(cluster, "limit", plan.limit_s)
        progress(f"wide: filling {plan.consume_records:,} records over "
                 f"{plan.consume_partitions} partitions")  # fmt: skip
        out["consume_fill_s"] = round(
            fill(cluster, "consume", plan.consume_partitions, plan.consume_records), 1
        )
        progress("wide: Consumer defaults, read_committed, reading it all")
        out["consume"] = consume_rate(cluster, "consume", plan.consume_partitions,
                                      plan.consume_records)  # fmt: skip
    finally:
        cluster.stop()
    progress("wide: limits: no-op FastAPI produce and fetch")
    out["noop"] = noop_limits(plan.quick, plan.limit_s, root)
    keyed = out["keyed_3"]["records_per_s"]
    out["keyless_over_keyed"] = round(out["keyless_3"]["records_per_s"] / keyed, 3) if keyed else 0
    rf1 = out["keyed_3_rf1"]["records_per_s"]
    out["rf3_over_rf1"] = round(keyed / rf1, 3) if rf1 else 0.0
    return out
