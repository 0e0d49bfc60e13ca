"""Benchmark of the Spark pipeline: exactly-once against at-least-once, same job, and the
limits of this machine measured in the same run.

    python -m eos_bench.bench_spark [--records 1000000] [--rounds 3] [--no-fsync]

Starts one storage node (KIP-890 verification on) and one coordinator (SQLite) as
processes, writes ``--records`` records to a two-partition source topic, then copies them
through ``spark_jobs.eos_pipeline`` in local mode (``local[2]``), each run into a new topic
under a new application id:

1. at-least-once: an idempotent producer id per task, offsets committed after the output;
2. exactly-once: a transactional id per source partition (``{app}-{topic}-{p}``), output
   and offsets in one transaction per partition and batch.

The limits, measured between the same runs on the same services:

* **the same job writing nothing**: the pipeline with a transform that drops every
  record (the tasks read the whole range read_committed and commit offsets): Spark's own
  cost plus reading, the most any copy can reach;
* **the node's accept rate**: the same records produced straight to the node in the
  pipeline's batches, one thread per partition, without Spark or reading.

Beside the rates, each mode's CPU time per input record is split by process (the node,
the coordinator, Spark's JVM, the Python workers, the driver; read from ``/proc``): on a
shared machine the rates move with the neighbours' load, the CPU per record much less.

A small warm-up of each mode comes first (Spark's first job pays for starting Python
workers). The modes run ``--rounds`` times, interleaved, and the median of each is
reported: the machine is shared, and one run can be slowed by a neighbour. Records per
second are input records copied divided by the job's wall time, planning included.
The targets: exactly-once at 100,000 records/s or more, and no less than 0.9 times
at-least-once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from eos_bench.harness import Server, free_port
from sdk import AdminClient, ConsumerRecord, Producer
from spark_jobs._wire import init_producer_id
from spark_jobs.batch_writer import BatchWriter
from spark_jobs.eos_pipeline import PipelineConfig, build_session, run_pipeline
from spark_jobs.transforms import OutputRecord, copy_to

TOKEN = "bench-internal-token-0123456789abcdef"
PARTITIONS = 2


def start_services(root: Path, fsync: bool) -> tuple[str, list[Server]]:
    node_port, coord_port = free_port(), free_port()
    url = f"http://127.0.0.1:{coord_port}"
    node = [
        sys.executable, "-m", "partition_service", "--node-id", "1", "--port", str(node_port),
        "--data-dir", str(root / "node"), "--internal-token", TOKEN,
        "--coordinator-url", url, "--group-offset-partitions", "5", "--log-level", "warning",
    ]
    if not fsync:
        node.append("--no-fsync")
    coordinator = [
        sys.executable, "-m", "coordinator_service", "--port", str(coord_port),
        "--data-dir", str(root / "coordinator"), "--nodes", f"1=http://127.0.0.1:{node_port}",
        "--internal-token", TOKEN, "--group-offset-partitions", "5", "--log-level", "warning",
    ]
    servers = [
        Server(node, node_port, root / "node.log"),
        Server(coordinator, coord_port, root / "coordinator.log"),
    ]
    for server in servers:
        server.start()
    return url, servers


def _value(i: int, value_bytes: int) -> str:
    return f"{i:08d}" + "x" * max(0, value_bytes - 8)


ROLES = ("node", "coordinator", "jvm", "workers", "driver")


def _role(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver"
    if "-m partition_service" in cmdline:
        return "node"
    if "-m coordinator_service" in cmdline:
        return "coordinator"
    if "pyspark" in cmdline and "java" not in cmdline.split(" ", 1)[0]:
        return "workers"
    return "jvm" if "java" in cmdline else "driver"


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by this process and its descendants, by role (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                cmdline = f.read().replace("\0", " ")
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks, cmdline)
    used = dict.fromkeys(ROLES, 0.0)
    for pid, (_, seconds, cmdline) in stats.items():
        ancestor = pid
        while ancestor in stats and ancestor != os.getpid():
            ancestor = stats[ancestor][0]
        if ancestor == os.getpid():
            used[_role(pid, cmdline)] += seconds
    return used


def fill(url: str, topic: str, records: int, value_bytes: int) -> float:
    """Write the source with the SDK's idempotent producer; returns records/s."""
    began = time.monotonic()
    with Producer(url, linger_ms=5, batch_size=512 * 1024) as producer:
        for i in range(records):
            producer.send(topic, _value(i, value_bytes), key=f"k{i}")
        producer.flush()
    return records / (time.monotonic() - began)


def drop_all(record: ConsumerRecord) -> Iterable[OutputRecord]:
    """The no-op transform: the job reads everything and writes nothing."""
    return ()


def copy(
    spark: object, url: str, source: str, transactional: bool, batch: int,
    *, write: bool = True,
) -> float:
    """One run of the pipeline into a new topic; returns input records/s. ``write=False``
    runs the same job with ``drop_all`` (at-least-once: offsets only)."""
    sink = f"sink-{uuid.uuid4().hex[:8]}"
    with AdminClient(url) as admin:
        admin.create_topic(sink, PARTITIONS)
    config = PipelineConfig(
        url, f"bench-{uuid.uuid4().hex[:8]}", source, transactional=transactional,
        max_batch_records=batch, transaction_timeout_ms=600_000,
    )
    transform = copy_to(sink) if write else drop_all
    stats = run_pipeline(spark, config, transform=transform)  # type: ignore[arg-type]
    with AdminClient(url) as admin:
        out = sum(admin.list_offsets((sink, p)).last_stable_offset for p in range(PARTITIONS))
    if stats.records_in == 0 or out < stats.records_out:
        raise SystemExit(f"run lost records: {stats.records_in} in, {out} visible")
    return stats.records_in / stats.seconds


def node_accept_rate(url: str, records: int, value_bytes: int) -> float:
    """The same records produced to a new topic in the pipeline's batches (idempotent,
    one writer thread per partition, records made before the clock starts)."""
    sink = f"accept-{uuid.uuid4().hex[:8]}"
    with AdminClient(url) as admin:
        admin.create_topic(sink, PARTITIONS)
    shares = [
        [
            OutputRecord(sink, _value(i, value_bytes), f"k{i}", p)
            for i in range(p, records, PARTITIONS)
        ]
        for p in range(PARTITIONS)
    ]
    writers = [BatchWriter(url, init_producer_id(url)) for _ in range(PARTITIONS)]
    failures: list[BaseException] = []

    def run(writer: BatchWriter, share: list[OutputRecord]) -> None:
        try:
            for record in share:
                writer.write(record)
            writer.flush()
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(w, s)) for w, s in zip(writers, shares, strict=True)
    ]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - began
    for writer in writers:
        writer.close()
    if failures:
        raise failures[0]
    return records / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=250_000,
                        help="most records per source partition per batch")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each mode (interleaved); the median is reported")
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="eos-bench-spark-"))
    url, servers = start_services(root, fsync=not args.no_fsync)
    spark = None
    runs: dict[str, list[float]] = {"noop": [], "accept": [], "alo": [], "eo": []}
    cpu: dict[str, list[dict[str, float]]] = {mode: [] for mode in runs}
    try:
        with AdminClient(url) as admin:
            admin.create_topic("source", PARTITIONS)
            admin.create_topic("warmup", PARTITIONS)
        fill(url, "warmup", 10_000, args.value_bytes)
        rate_in = fill(url, "source", args.records, args.value_bytes)
        spark = build_session("local[2]", "bench-spark", **{"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        for transactional in (False, True):
            copy(spark, url, "warmup", transactional, args.batch)
        for _ in range(args.rounds):
            for mode in ("noop", "alo", "eo", "accept"):
                before = cpu_seconds()
                if mode == "accept":
                    runs[mode].append(node_accept_rate(url, args.records, args.value_bytes))
                else:
                    runs[mode].append(
                        copy(spark, url, "source", mode == "eo", args.batch, write=mode != "noop")
                    )
                after = cpu_seconds()
                cpu[mode].append(
                    {r: (after[r] - before[r]) / args.records * 1e6 for r in ROLES}
                )
    finally:
        if spark is not None:
            spark.stop()
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    median = {mode: statistics.median(rates) for mode, rates in runs.items()}
    fsync = "off" if args.no_fsync else "on"
    print(f"{args.records} records of {args.value_bytes} B, {PARTITIONS} partitions, "
          f"1 node (fsync {fsync}), Spark local[2], {args.batch} records/partition/batch, "
          f"median of {args.rounds} rounds")
    print(f"  source written by the SDK's idempotent producer: {rate_in:10,.0f} records/s")
    print(f"  limit: node accept rate, pipeline batches:       {median['accept']:10,.0f} records/s")
    print(f"  limit: the same job writing nothing:              {median['noop']:10,.0f} records/s")
    print(f"  pipeline at-least-once (no transactions):        {median['alo']:10,.0f} records/s")
    print(f"  pipeline exactly-once (transactions):            {median['eo']:10,.0f} records/s")
    ratio = median["eo"] / median["alo"]
    print(f"  exactly-once / at-least-once:                    {ratio:10.2f}  (target >= 0.9)")
    print(f"  exactly-once / the job writing nothing:          "
          f"{median['eo'] / median['noop']:10.2f}")
    names = {"accept": "node accept", "noop": "writing nothing", "alo": "at-least-once",
             "eo": "exactly-once"}
    print("  CPU us per record (median): " + " / ".join(ROLES) + " = total")
    for mode in ("accept", "noop", "alo", "eo"):
        parts = {r: statistics.median(c[r] for c in cpu[mode]) for r in ROLES}
        print(f"    {names[mode]:16s} " + " / ".join(f"{parts[r]:.1f}" for r in ROLES)
              + f" = {sum(parts.values()):.1f}")
    for mode, rates in runs.items():
        print(f"  runs {names[mode]:16s} " + "  ".join(f"{r:,.0f}" for r in rates))


if __name__ == "__main__":
    main()
