"""Benchmark of the Spark pipeline: exactly-once against at-least-once, same job.

    python -m eos_bench.bench_spark [--records 1000000] [--value-bytes 100] [--no-fsync]

Starts one storage node (KIP-890 verification on) and one coordinator (SQLite) as
processes, writes ``--records`` records to a two-partition source topic, then copies them
through ``spark_jobs.eos_pipeline`` in local mode (``local[2]``) twice, each into a new
topic under a new application id:

1. at-least-once: idempotent ``Producer`` per task, offsets committed after the output;
2. exactly-once: ``TransactionalProducer`` per source partition (``{app}-{topic}-{p}``),
   output and offsets in one transaction per partition and batch.

A small warm-up run of each mode comes first (Spark's first job pays for starting Python
workers). Records per second are input records copied divided by the job's wall time,
planning included. The target is exactly-once at no less than 0.9 times at-least-once.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from eos_bench.harness import Server, free_port
from sdk import AdminClient, Producer
from spark_jobs.eos_pipeline import PipelineConfig, build_session, run_pipeline
from spark_jobs.transforms import copy_to

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


def fill(url: str, topic: str, records: int, value_bytes: int) -> float:
    """Write the source; returns records/s of the write."""
    pad = "x" * max(0, value_bytes - 8)
    began = time.monotonic()
    with Producer(url, linger_ms=5, batch_size=512 * 1024) as producer:
        for i in range(records):
            producer.send(topic, f"{i:08d}{pad}", key=f"k{i}")
        producer.flush()
    return records / (time.monotonic() - began)


def copy(spark: object, url: str, source: str, transactional: bool, batch: int) -> float:
    """One run of the pipeline into a new topic; returns input records/s."""
    sink = f"sink-{uuid.uuid4().hex[:8]}"
    with AdminClient(url) as admin:
        admin.create_topic(sink, PARTITIONS)
    config = PipelineConfig(
        url, f"bench-{uuid.uuid4().hex[:8]}", source, transactional=transactional,
        max_batch_records=batch, max_poll_records=5000, linger_ms=20,
        batch_size=1024 * 1024, transaction_timeout_ms=600_000,
    )
    stats = run_pipeline(spark, config, transform=copy_to(sink))  # type: ignore[arg-type]
    with AdminClient(url) as admin:
        out = sum(admin.list_offsets((sink, p)).last_stable_offset for p in range(PARTITIONS))
    if stats.records_in == 0 or out < stats.records_out:
        raise SystemExit(f"run lost records: {stats.records_in} in, {out} visible")
    return stats.records_in / stats.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=250_000,
                        help="most records per source partition per batch")
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="eos-bench-spark-"))
    url, servers = start_services(root, fsync=not args.no_fsync)
    spark = None
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
        plain = copy(spark, url, "source", False, args.batch)
        exact = copy(spark, url, "source", True, args.batch)
    finally:
        if spark is not None:
            spark.stop()
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    fsync = "off" if args.no_fsync else "on"
    print(f"{args.records} records of {args.value_bytes} B, {PARTITIONS} partitions, "
          f"1 node (fsync {fsync}), Spark local[2], {args.batch} records/partition/batch")
    print(f"  source written by the idempotent producer: {rate_in:10,.0f} records/s")
    print(f"  pipeline at-least-once (no transactions):  {plain:10,.0f} records/s")
    print(f"  pipeline exactly-once (transactions):      {exact:10,.0f} records/s")
    print(f"  exactly-once / at-least-once:              {exact / plain:10.2f}  (target >= 0.9)")


if __name__ == "__main__":
    main()
