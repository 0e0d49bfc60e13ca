"""The replication part of ``eos bench``: what three replicas cost and how fast a leader
is replaced.

    python -m eos_bench.suite_replication [--seconds N] [--rounds N] [--failovers N]
                                          [--no-fsync] [--json]

One coordinator (SQLite, the controller) and three storage nodes with fsync on (off with
``--no-fsync``), as processes on this machine. In the same run:

* **produce throughput**, RF=3 with acks=all (every batch on the three replicas before it
  is answered) against RF=1, the idempotent ``Producer`` sending 1 KB records to one
  partition, rounds alternating so outside load falls on both; the limit is RF=1 itself,
  the same node and client without replication (the issue's target: RF=3 at 0.5 of it);
* **commit -> visible**, RF=3: ``commit_transaction()`` returned until a read_committed
  long poll on the leader returns the record (the markers written and replicated, the
  high watermark and the last stable offset past them); p50 and p99;
* **leader failover**, RF=3: SIGKILL of the partition's leader while a producer keeps
  sending, until the first write acknowledged by the new leader; the limit is the
  controller's node session timeout, which a failover cannot beat (the target: < 3 s).

Everything runs on one shared machine: the followers' fetches compete with the leader and
the client for the same two cores, which a cluster of hosts would not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from eos_cli.launcher import ClusterPlan, LocalCluster
from sdk import AdminClient, Producer, TransactionalProducer

RECORD = "x" * 1024
SESSION_TIMEOUT_MS = 2_000  # the coordinator's default node_session_timeout_ms


def start_cluster(root: Path, fsync: bool = True) -> LocalCluster:
    plan = ClusterPlan(root, nodes=3, coordinators=1, port_base=None, fsync=fsync,
                       coordinator_flags=("--leader-rebalance-interval-ms", "0"))  # fmt: skip
    return LocalCluster(plan).start()


def produce_rate(url: str, topic: str, seconds: float) -> float:
    """Records per second acknowledged to one idempotent producer on partition 0."""
    with Producer(url, linger_ms=5) as producer:
        for _ in range(200):  # warm: metadata, connections, the producer id
            producer.send(topic, RECORD, partition=0)
        producer.flush()
        sent = 0
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            for _ in range(500):
                producer.send(topic, RECORD, partition=0)
            sent += 500
        producer.flush()
        return sent / (time.monotonic() - began)


def commit_to_visible(url: str, topic: str, samples: int) -> list[float]:
    """Seconds from commit_transaction() returning to the record being read read_committed."""
    with AdminClient(url) as admin:
        leader = admin.describe_topic(topic).partitions[0].leader.url
    latencies: list[float] = []
    fetch = f"{leader}/v1/partitions/{topic}/0/records"
    with TransactionalProducer(url, f"bench-e2e-{uuid.uuid4().hex[:6]}", linger_ms=0) as p, \
            httpx.Client(timeout=30) as reader:  # fmt: skip
        p.init_transactions()
        for _ in range(samples):
            lso = reader.get(f"{leader}/v1/partitions/{topic}/0/offsets").json()[
                "last_stable_offset"
            ]
            p.begin_transaction()
            p.send(topic, "e2e", partition=0)
            p.commit_transaction()
            returned = time.monotonic()
            while time.monotonic() - returned < 30:
                answer = reader.get(fetch, params={"offset": lso, "max_records": 1,
                                                   "isolation_level": "read_committed",
                                                   "max_wait_ms": 1000}).json()  # fmt: skip
                if answer.get("records"):
                    break
            latencies.append(time.monotonic() - returned)
    return latencies


def failover_once(cluster: LocalCluster, topic: str) -> float:
    """SIGKILL the leader while a producer sends; seconds until a write is acknowledged
    by the new leader. The killed node is started again and back in the ISR after."""
    url = cluster.url
    with AdminClient(url) as admin:
        leader = admin.describe_topic(topic).partitions[0].leader.node_id
    acked: list[float] = []
    stop = threading.Event()

    def send() -> None:
        with Producer(url, linger_ms=0) as producer:
            while not stop.is_set():
                producer.send(topic, "f", partition=0)
                producer.flush()
                acked.append(time.monotonic())

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    _wait(lambda: len(acked) > 20, 30, "writes before the kill")
    killed = time.monotonic()
    cluster.node(leader).kill()
    _wait(lambda: any(t > killed for t in acked), 60, "a write after the kill")
    seconds = min(t for t in acked if t > killed) - killed
    stop.set()
    sender.join(timeout=60)
    cluster.node(leader).start()
    with AdminClient(url) as admin:
        _wait(lambda: len(admin.describe_topic(topic).partitions[0].isr) == 3, 60,
              "the restarted node back in the ISR")  # fmt: skip
    return seconds


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f}s")
        time.sleep(0.02)


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def run_replication(
    seconds: float,
    rounds: int,
    samples: int,
    failovers: int,
    progress: Any = print,
    fsync: bool = True,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="eos-bench-replication-"))
    cluster = start_cluster(root / "cluster", fsync)
    try:
        url = cluster.url
        with AdminClient(url) as admin:
            admin.create_topic("rf1", 1, replication_factor=1)
            admin.create_topic("rf3", 1, replication_factor=3, min_insync_replicas=2)
            admin.create_topic("e2e3", 1, replication_factor=3, min_insync_replicas=2)
        rf1: list[float] = []
        rf3: list[float] = []
        for r in range(rounds):
            progress(f"replication: produce round {r + 1}/{rounds}, RF=1 then RF=3")
            rf1.append(produce_rate(url, "rf1", seconds))
            rf3.append(produce_rate(url, "rf3", seconds))
        progress(f"replication: commit -> visible with RF=3, {samples} transactions")
        latencies = commit_to_visible(url, "e2e3", samples)
        times = []
        for f in range(failovers):
            progress(f"replication: leader failover {f + 1}/{failovers}")
            times.append(failover_once(cluster, "rf3"))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    produce1, produce3 = statistics.median(rf1), statistics.median(rf3)
    return {
        "produce_rf1_records_per_s": round(produce1),
        "produce_rf3_records_per_s": round(produce3),
        "rf3_over_rf1": round(produce3 / produce1, 3) if produce1 else 0.0,
        "commit_to_visible_rf3": {"samples": len(latencies), "p50_ms": _ms(latencies, 0.5),
                                  "p99_ms": _ms(latencies, 0.99)},
        "failover_s": [round(t, 3) for t in times],
        "failover_max_s": round(max(times), 3) if times else None,
        "session_timeout_s": SESSION_TIMEOUT_MS / 1000,
        "fsync": fsync,
    }


def report(res: dict[str, Any]) -> str:
    e2e = res["commit_to_visible_rf3"]
    lines = [
        f"produce 1 KB, RF=1 (rec/s)            {res['produce_rf1_records_per_s']:>10,}",
        f"produce 1 KB, RF=3 acks=all (rec/s)   {res['produce_rf3_records_per_s']:>10,}"
        f"   {res['rf3_over_rf1']:.2f} of RF=1 (target >= 0.5)",
        f"commit -> visible, RF=3               p50 {e2e['p50_ms']:.1f} ms, "
        f"p99 {e2e['p99_ms']:.1f} ms over {e2e['samples']} (target p99 < 50 ms)",
        f"leader SIGKILL -> first write on new  {res['failover_s']} s"
        f"   limit: session timeout {res['session_timeout_s']:.1f} s (target < 3 s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-fsync", action="store_true",
        help="nodes acknowledge without fsync: shows what three replicas' fsyncs on one "
        "shared disk cost, which replicas on their own hosts do not pay",
    )  # fmt: skip
    args = parser.parse_args(argv)
    res = run_replication(args.seconds, args.rounds, args.samples, args.failovers,
                          fsync=not args.no_fsync)  # fmt: skip
    print(json.dumps(res, indent=2) if args.json else report(res))


if __name__ == "__main__":
    main()
