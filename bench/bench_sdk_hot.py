"""The SDK's hot paths against the node's own limit, measured in one run.

    python -m eos_bench.bench_sdk_hot [--quick] [--seconds N] [--rounds N] [--json]

Against one storage node and one coordinator (``bench_sdk.Cluster``, fsync on):

1. the node's accept limit: 8 connections posting 1,000-record batches of 100 B values
   with the services' own keep-alive client (``bench_node.produce_steps``), no SDK;
2. one ``Producer`` sending 100 B values with ``send`` (a future per record) and with
   ``send_many`` (a list per call, still a future per record);
3. one ``Consumer`` reading a transactionally written log ``read_committed``;
4. the transactional producer over the idempotent one at 1 KB records and a commit every
   100 ms: rounds alternate idempotent, transactional, idempotent, ... and the figure is
   the median of the rounds' ratios (each ratio of a round's two adjacent runs, so that
   outside load drifting between rounds falls on both), as Kafka reports it.

The SDK is asked to do what an application would: the producer with a ``batch_size`` of
256 KB (at the 16 KB default a batch holds about 115 records of 100 B, and the request
rate, not the SDK, sets the limit), the consumer with its defaults plus a larger
``max_poll_records``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eos_bench.bench_node import produce_steps
from eos_bench.bench_sdk import Cluster, Result, run_sync
from eos_bench.load import drive
from sdk import Consumer, Producer, TransactionalProducer

VALUE_100 = "v" * 100
HOT_BATCH_SIZE = 256 * 1024
#: Records sent ahead of their acknowledgement, at most: a few batches' worth.
HOT_WINDOW = 20_000
CHUNK = 1_000  # records per send_many call, and per check of the clock with send
CONSUMER_LOG = 300_000  # records the consumer reads, written in transactions of 50,000
POLL_RECORDS = 5_000


@dataclass
class Rate:
    name: str
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def node_limit(cluster: Cluster, seconds: float) -> Rate:
    """What the node accepts from 8 connections of 1,000-record batches of 100 B, the same
    node the SDK runs below use (its own partition, producer ids far from the SDK's)."""
    topic = cluster.topic("limit")["name"]
    path = f"/v1/partitions/{topic}/0/records"
    first_pid = 900_000_000 + (uuid.uuid4().int % 1_000_000) * 10
    steps = produce_steps(lambda _i: path, first_pid)
    pid = cluster.procs[0].pid
    result = asyncio.run(drive(cluster.node_port, pid, steps, 1.0, seconds))
    return Rate("node accept limit, 8 x 1000-record batches", result.records, result.seconds)


def producer_100b(cluster: Cluster, seconds: float, many: bool) -> Rate:
    """One ``Producer``; at most ``HOT_WINDOW`` records unacknowledged (the oldest
    future of a chunk is waited on), so the figure is acknowledged records."""
    topic = cluster.topic("p100")["name"]
    values = [VALUE_100] * CHUNK
    pending: collections.deque[Any] = collections.deque()
    sent = 0
    with Producer(cluster.url, batch_size=HOT_BATCH_SIZE) as producer:
        producer.send(topic, VALUE_100).result()  # metadata and producer id
        start = time.monotonic()
        stop = start + seconds
        while time.monotonic() < stop:
            if many:
                futures = producer.send_many(topic, values)
                pending.append(futures[-1])
            else:
                send = producer.send
                for value in values:
                    last = send(topic, value)
                pending.append(last)
            sent += CHUNK
            while len(pending) * CHUNK > HOT_WINDOW:
                pending.popleft().result()
        producer.flush()
        elapsed = time.monotonic() - start
    name = "Producer.send_many" if many else "Producer.send"
    return Rate(f"{name}, 100 B records", sent, elapsed)


def fill_committed(cluster: Cluster, records: int) -> str:
    """A one-partition topic holding ``records`` committed records of 100 B, written in
    transactions of 50,000 (so read_committed has markers and an LSO to follow)."""
    topic: str = cluster.topic_with("consume", 1)["name"]
    producer = TransactionalProducer(
        cluster.url, f"fill-{uuid.uuid4().hex[:8]}", batch_size=HOT_BATCH_SIZE
    )
    try:
        producer.init_transactions()
        left = records
        while left > 0:
            n = min(50_000, left)
            producer.begin_transaction()
            for _ in range(n):
                producer.send(topic, VALUE_100, partition=0)
            producer.commit_transaction()
            left -= n
    finally:
        producer.close()
    return topic


def consumer_read(cluster: Cluster, topic: str, records: int) -> Rate:
    """One ``Consumer`` reading the whole log from offset 0, read_committed."""
    got = 0
    with Consumer(cluster.url, max_poll_records=POLL_RECORDS) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), 0)
        start = time.monotonic()
        while got < records:
            got += len(consumer.poll(timeout=1.0))
        elapsed = time.monotonic() - start
    return Rate("Consumer read_committed, 100 B records", got, elapsed)


def txn_ratio(cluster: Cluster, seconds: float, rounds: int) -> dict[str, Any]:
    """Alternating idempotent and transactional (100 ms commits) runs of 1 KB records."""
    idem: list[Result] = []
    txn: list[Result] = []
    for _ in range(rounds):
        idem.append(run_sync(cluster, seconds, None))
        txn.append(run_sync(cluster, seconds, 100))
    pairs = [t.rate / i.rate for i, t in zip(idem, txn, strict=True)]
    return {
        "rounds": rounds,
        "seconds_per_run": seconds,
        "idempotent_records_per_s": [round(r.rate) for r in idem],
        "transactional_records_per_s": [round(r.rate) for r in txn],
        "commit_ms": [round(r.commit_ms, 1) for r in txn],
        "ratios": [round(p, 4) for p in pairs],
        "median_ratio": round(statistics.median(pairs), 4),
    }


def run_hot(
    seconds: float,
    rounds: int,
    ratio_rounds: int,
    progress: Callable[[str], None],
    cluster: Cluster | None = None,
) -> dict[str, Any]:
    """Every hot-path figure; the cheap ones are the median of ``rounds``. On ``cluster``
    if given (left running), else on one of its own."""
    own = cluster is None
    cluster = cluster or Cluster(fsync=True)
    try:
        progress("sdk hot: filling the consumer's log")
        topic = fill_committed(cluster, CONSUMER_LOG)
        runs: dict[str, list[Rate]] = collections.defaultdict(list)
        for n in range(rounds):
            progress(f"sdk hot: round {n + 1} of {rounds}")
            runs["node_limit"].append(node_limit(cluster, seconds))
            runs["send"].append(producer_100b(cluster, seconds, many=False))
            runs["send_many"].append(producer_100b(cluster, seconds, many=True))
            runs["consumer"].append(consumer_read(cluster, topic, CONSUMER_LOG))
        progress(f"sdk hot: txn/idempotent, {ratio_rounds} alternating rounds")
        ratio = txn_ratio(cluster, seconds, ratio_rounds)
    except BaseException:
        if own:
            log = (cluster.dir / "services.log").read_text(errors="replace")
            print("--- services.log (tail) ---\n" + log[-4000:], file=sys.stderr)
        raise
    finally:
        if own:
            cluster.stop()
    out: dict[str, Any] = {}
    for key, rates in runs.items():
        best = sorted(rates, key=lambda r: r.rate)[len(rates) // 2]
        out[key] = {"name": best.name, "records_per_s": round(best.rate),
                    "rounds": [round(r.rate) for r in rates]}
    limit = out["node_limit"]["records_per_s"] or 1
    for key in ("send", "send_many"):
        if key in out:
            out[key]["vs_node_limit"] = round(out[key]["records_per_s"] / limit, 4)
    out["txn_ratio_1kb_100ms"] = ratio
    out["seconds_per_run"] = seconds
    return out


def hot_rows(hot: dict[str, Any]) -> list[tuple[str, str, float | None]]:
    """(label, value, over its limit) rows of the hot-path figures, in table order."""
    rows: list[tuple[str, str, float | None]] = []
    for key, label in (("send", "sdk Producer.send, 100 B (rec/s)"),
                       ("send_many", "sdk Producer.send_many, 100 B (rec/s)")):
        if key in hot:
            rows.append((label, f"{hot[key]['records_per_s']:,}", hot[key].get("vs_node_limit")))
    if "consumer" in hot:
        rows.append(("sdk Consumer read_committed, 100 B (rec/s)",
                     f"{hot['consumer']['records_per_s']:,}", None))
    if "node_limit" in hot:
        rows.append(("  limit: node accept, 8 x 1000-record batches",
                     f"{hot['node_limit']['records_per_s']:,}", None))
    ratio = hot.get("txn_ratio_1kb_100ms")
    if ratio:
        rows.append((f"sdk txn/idempotent, 1 KB, 100 ms (median of {ratio['rounds']})",
                     f"{ratio['median_ratio']:.3f}", None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 2 s runs")
    parser.add_argument("--seconds", type=float, default=None, help="per run (default 4)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    parser.add_argument("--ratio-rounds", type=int, default=5,
                        help="alternating rounds of the txn/idempotent ratio (default 5)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    rounds = args.rounds or (1 if args.quick else 3)

    def progress(step: str) -> None:
        print(f"... {step}", file=sys.stderr, flush=True)

    hot = run_hot(seconds, rounds, args.ratio_rounds, progress)
    if args.json:
        print(json.dumps(hot, indent=2))
        return 0
    for label, value, vs in hot_rows(hot):
        print(f"{label:<58} {value:>12} {'' if vs is None else f'{100 * vs:.1f}%':>8}")
    ratio = hot["txn_ratio_1kb_100ms"]
    print(f"\nratio rounds: {ratio['ratios']} (idempotent {ratio['idempotent_records_per_s']}, "
          f"transactional {ratio['transactional_records_per_s']}, commit ms "
          f"{ratio['commit_ms']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
