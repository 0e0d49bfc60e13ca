"""The client-side parts of ``eos bench``, built on ``bench/bench_sdk.py`` and
``bench/bench_spark.py``:

* the SDK's transactional producer committing every 10 ms, 100 ms and 1 s against the
  idempotent (non-transactional) producer, with plain httpx batches as the limit: the
  commit interval is the records-per-transaction axis of the cost growth;
* the SDK's hot paths on the same node (``bench/bench_sdk_hot.py``): one ``Producer``
  sending 100 B records with ``send`` and ``send_many`` against the node's own accept
  limit measured in the same run, one ``Consumer`` reading read_committed, and the
  transactional over idempotent ratio at 1 KB and 100 ms commits, the median of 5
  alternating rounds;
* the Spark pipeline (``spark_jobs.eos_pipeline``, ``local[2]``) with and without
  transactions at three source sizes.

Both run in threads or child processes of their own, so they can be called from the
event loop of the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from eos_bench.bench_sdk import Cluster, Result, run_async, run_raw, run_sync
from eos_bench.bench_sdk_hot import hot_rows, run_hot

#: Alternating idempotent/transactional rounds of the ratio figure (Kafka's way).
RATIO_ROUNDS = 5


def result_json(r: Result, base: Result | None) -> dict[str, Any]:
    return {
        "name": r.name,
        "records_per_s": round(r.rate),
        "mb_per_s": round(r.mb_s, 2),
        "transactions": r.transactions,
        "commit_ms": round(r.commit_ms, 1),
        "records_per_txn": round(r.records / r.transactions) if r.transactions else None,
        "cost_vs_idempotent": None if base is None else round(1 - r.rate / base.rate, 4),
    }


def median(results: list[Result]) -> Result:
    """The middle round by rate (the upper middle of an even count)."""
    return sorted(results, key=lambda r: r.rate)[len(results) // 2]


def sdk_hot_rows(sdk: dict[str, Any]) -> list[tuple[str, str, float | None]]:
    """The hot-path rows (label, value, over its limit), if the run measured them."""
    return hot_rows(sdk.get("hot") or {})


def sdk_rows(sdk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SDK results in table order, each with its label."""
    rows = [("sdk idempotent producer, 1 KB records (rec/s)", sdk["idempotent"])]
    for t in sdk["transactional"]:
        cost = t["cost_vs_idempotent"] or 0.0
        rows.append((f"sdk transactional, commit every {t['commit_interval_ms']} ms "
                     f"(cost {100 * cost:+.0f}%)", t))
    if "async_idempotent" in sdk:
        rows.append(("sdk async idempotent producer (rec/s)", sdk["async_idempotent"]))
        t = sdk["async_transactional_100ms"]
        cost = t["cost_vs_idempotent"] or 0.0
        rows.append((f"sdk async transactional, every 100 ms (cost {100 * cost:+.0f}%)", t))
    return rows


def run_sdk(plan: Any, progress: Any) -> dict[str, Any]:
    """Every SDK figure: rounds of every mode in turn (so outside load falls on all of them
    alike), each mode's figure its median round."""
    intervals = plan.commit_intervals_ms
    cluster = Cluster(fsync=True)
    try:
        rounds: list[list[Result]] = []
        for n in range(plan.sdk_rounds):
            progress(f"sdk: round {n + 1} of {plan.sdk_rounds}")
            row = [run_raw(cluster, plan.sdk_s), run_sync(cluster, plan.sdk_s, None)]
            row += [run_sync(cluster, plan.sdk_s, ms) for ms in intervals]
            # the asyncio twins at the middle interval: the same protocol, another client
            row += [run_async(cluster, plan.sdk_s, None), run_async(cluster, plan.sdk_s, 100)]
            rounds.append(row)
        hot = run_hot(plan.sdk_s, plan.sdk_rounds, RATIO_ROUNDS, progress, cluster)
    except BaseException:
        log = (cluster.dir / "services.log").read_text(errors="replace")
        print("--- services.log (tail) ---\n" + log[-4000:], file=sys.stderr)
        raise
    finally:
        cluster.stop()
    raw, idem, *txns, aidem, atxn = (
        median([r[i] for r in rounds]) for i in range(len(rounds[0]))
    )
    return {
        "raw_httpx": result_json(raw, None),
        "idempotent": result_json(idem, None),
        "transactional": [
            {"commit_interval_ms": ms, **result_json(t, idem)}
            for ms, t in zip(intervals, txns, strict=True)
        ],
        "async_idempotent": result_json(aidem, None),
        "async_transactional_100ms": {"commit_interval_ms": 100, **result_json(atxn, aidem)},
        "rounds": plan.sdk_rounds,
        "seconds_per_run": plan.sdk_s,
        "hot": hot,
    }


SPARK_SCRIPT = """
import sys, json, shutil, tempfile
from pathlib import Path
from eos_bench.bench_spark import start_services, fill, copy
from eos_bench.bench_spark_stream import stream_copy, stream_latency
from sdk import AdminClient
from spark_jobs.eos_pipeline import build_session

sizes = {sizes!r}
root = Path(tempfile.mkdtemp(prefix="eos-bench-spark-"))
url, servers = start_services(root, fsync=True)
spark = None
out = []
try:
    with AdminClient(url) as admin:
        admin.create_topic("warmup", 2)
        for n in sizes:
            admin.create_topic(f"source-{{n}}", 2)
    fill(url, "warmup", 10_000, 100)
    spark = build_session("local[2]", "bench-spark", **{{"spark.ui.enabled": "false"}})
    spark.sparkContext.setLogLevel("ERROR")
    for transactional in (False, True):
        copy(spark, url, "warmup", transactional, 250_000)
    for n in sizes:
        rate_in = fill(url, f"source-{{n}}", n, 100)
        plain = copy(spark, url, f"source-{{n}}", False, 250_000)
        exact = copy(spark, url, f"source-{{n}}", True, 250_000)
        stream_plain = stream_copy(spark, url, f"source-{{n}}", n, False)
        stream_exact = stream_copy(spark, url, f"source-{{n}}", n, True)
        out.append({{"records": n, "fill_records_per_s": round(rate_in),
                    "at_least_once_records_per_s": round(plain),
                    "exactly_once_records_per_s": round(exact),
                    "ratio": round(exact / plain, 3),
                    "stream_at_least_once_records_per_s": round(stream_plain),
                    "stream_exactly_once_records_per_s": round(stream_exact),
                    "stream_ratio": round(stream_exact / stream_plain, 3)}})
    latency = stream_latency(spark, url)
finally:
    if spark is not None:
        spark.stop()
    for server in reversed(servers):
        server.stop()
    shutil.rmtree(root, ignore_errors=True)
print("RESULT " + json.dumps({{"runs": out, "stream_latency": latency}}))
"""


def run_spark(plan: Any, progress: Any) -> dict[str, Any]:
    """The pipeline with and without transactions at each source size, in a child process
    (Spark's JVM and its Python workers stay out of the suite's process)."""
    import json

    progress(f"spark: pipeline over {', '.join(f'{n:,}' for n in plan.spark_sizes)} records")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    script = SPARK_SCRIPT.format(sizes=list(plan.spark_sizes))
    work = Path(tempfile.mkdtemp(prefix="eos-bench-spark-run-"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True,
            timeout=3600,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT "):]))
    return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}", "runs": []}
