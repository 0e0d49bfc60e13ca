"""The ``wide`` part of ``eos bench``: the cluster ``eos up`` starts, used the way a new
user would, and what many partitions cost it.

    python -m eos_bench.suite_wide [--quick] [--json]
    (or python -m bench.suite_wide from the source tree; eos bench --only wide)

The layout is ``eos up``'s: three storage nodes and one coordinator (SQLite), started
with ``eos_cli.launcher`` from the same ``ClusterPlan`` (default replication factor 3,
fsync on with group commit, the coordinator's SQLite in WAL with synchronous=FULL), on
free ports. The other parts tune their clients to find the services' limits; here every
client option is left at its default, because those are the figures a user meets first.

The throughput half (``bench/suite_wide_clients.py``), on one cluster:

1. one ``sdk.Producer(bootstrap)``, 100 B values, keyed (distinct keys) and keyless, on
   3 partitions RF=3; keyed on 100 partitions; ``send_many`` keyed on 3 partitions;
2. the same keyed producer on 3 partitions RF=1, so that RF=3 (acks=all) / RF=1 is read;
3. one ``sdk.Consumer(bootstrap)`` reading a 100-partition RF=3 topic read_committed;
4. the services' CPU per record (three nodes and the coordinator) beside each figure;

with the limits of the same run: the leader's accept rate for 8 connections posting
1,000-record batches to one RF=3 partition (no SDK), and the no-op FastAPI server
(``bench_node.bench_noop``: the machine's HTTP limit, and its CPU per record).

The partitions half, on a fresh cluster:

5. a 1,000-partition topic: the time from the create call until one record has been
   acknowledged on every partition, while another thread sends ``GET /v1/metadata`` (the
   call of ``AdminClient.describe_cluster``) in a loop: its latency and failures then,
   against the same call on the cluster before the topic existed;
6. four more such topics (5,000 partitions, 15,000 replicas): once every partition has
   its leader and a full ISR, the CPU of each service over an idle window, then the time
   to stop the cluster as ``eos up`` does on Ctrl-C (``LocalCluster.stop``: SIGTERM to
   the coordinator, then to every node at once, SIGKILL after 15 s).

Everything shares the machine's cores with the load generator (and whatever else runs):
the figures are rough, a single round each.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from eos_bench.bench_coordinator import machine_busy_seconds
from eos_bench.suite_wide_clients import (
    CpuWindow,
    Progress,
    run_clients,
    service_pids,
    start_cluster,
)
from eos_cli.launcher import LocalCluster
from sdk import AdminClient, Producer

#: What a node acknowledges with under eos up's defaults, for the report.
DURABILITY = ("fsync on (group commit), acks=all, min ISR 2; coordinator SQLite WAL, "
              "synchronous=FULL")  # fmt: skip
#: One attempt at a coordinator, as the SDK allows it (RetryConfig.coordinator_timeout_ms):
#: a metadata call slower than this would have been retried by a client.
METADATA_TIMEOUT_S = 5.0
#: After every partition is in place: the one-off work of the creation (followers' first
#: fetches, checkpoints) is left to finish before the idle window opens.
SETTLE_PAUSE_S = 2.0


@dataclass(frozen=True)
class WidePlan:
    quick: bool
    produce_s: float  # each producer run
    limit_s: float  # each limit run
    consume_records: int
    idle_s: float
    idle_empty_s: float
    consume_partitions: int = 100
    wide_partitions: int = 1_000
    wide_topics: int = 5
    baseline_metadata_s: float = 1.0
    producible_timeout_s: float = 120.0
    settle_timeout_s: float = 120.0


QUICK = WidePlan(quick=True, produce_s=3.0, limit_s=1.0, consume_records=200_000, idle_s=10.0,
                 idle_empty_s=2.0)  # fmt: skip
FULL = WidePlan(quick=False, produce_s=10.0, limit_s=4.0, consume_records=1_000_000,
                idle_s=30.0, idle_empty_s=5.0)  # fmt: skip


# -- 5. a 1,000-partition topic, metadata calls meanwhile ------------------------------------
class MetadataPoller:
    """``GET /v1/metadata`` in a loop on a thread of its own, every call timed; a call
    that fails or takes over ``METADATA_TIMEOUT_S`` counts as a failure."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/v1/metadata"
        #: (began, seconds, error or None, bytes of the answer)
        self.calls: list[tuple[float, float, str | None, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metadata-poller", daemon=True)

    def __enter__(self) -> MetadataPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=METADATA_TIMEOUT_S + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=METADATA_TIMEOUT_S) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                error: str | None = None
                size = 0
                try:
                    answer = client.get(self.url)
                    size = len(answer.content)
                    if answer.status_code != 200:
                        error = f"HTTP {answer.status_code}"
                except httpx.HTTPError as exc:
                    error = type(exc).__name__
                self.calls.append((began, time.monotonic() - began, error, size))
                if error is not None:
                    self._stop.wait(0.05)  # a refused connection must not spin the core

    def stats(self, since: float, until: float) -> dict[str, Any]:
        """The calls begun within [since, until]: count, failures, latency percentiles."""
        window = [c for c in self.calls if since <= c[0] <= until]
        ok = sorted(s for _, s, e, _ in window if e is None)
        errors = Counter(e for _, _, e, _ in window if e is not None)
        return {
            "calls": len(window),
            "failures": sum(errors.values()),
            "failure_kinds": dict(errors),
            "p50_ms": _ms(ok, 0.5),
            "p99_ms": _ms(ok, 0.99),
            "max_ms": round(1000 * max(c[1] for c in window), 2) if window else None,
            "largest_answer_bytes": max((c[3] for c in window), default=0),
        }


def _ms(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def create_until_producible(
    cluster: LocalCluster, topic: str, partitions: int, plan: WidePlan
) -> dict[str, Any]:
    """Seconds from the create call (``AdminClient.create_topic`` with the coordinator's
    default replication factor, as ``eos topics create`` sends it) until one record has
    been acknowledged on every partition, the records sent by a ``Producer`` with its
    defaults as soon as the call returns. A send that fails is sent again until the
    deadline. The producer is warmed first (its id, its connections), so the figure is
    the cluster's and not a new client's."""
    with AdminClient(cluster.url) as admin, Producer(cluster.url) as producer:
        admin.create_topic("warm", 1)
        producer.send("warm", "w").result(60)
        with MetadataPoller(cluster.url) as poller:
            time.sleep(plan.baseline_metadata_s)
            t0 = time.monotonic()
            info = admin.create_topic(topic, partitions)
            created = time.monotonic() - t0
            acked_at: dict[int, float] = {}

            def send(p: int) -> Future[Any]:
                """One record to partition ``p``, its acknowledgement time noted when the
                producer settles it (not when this thread gets round to looking)."""
                future = producer.send(topic, "x", partition=p)
                future.add_done_callback(
                    lambda f: acked_at.setdefault(p, time.monotonic())
                    if f.exception() is None else None
                )
                return future

            resends = 0
            deadline = t0 + plan.producible_timeout_s
            waiting = {p: send(p) for p in range(partitions)}
            while waiting and time.monotonic() < deadline:
                for p, future in list(waiting.items()):
                    try:
                        error = future.exception(timeout=max(0.0, deadline - time.monotonic()))
                    except TimeoutError:
                        break
                    if error is None:
                        del waiting[p]
                    else:
                        resends += 1
                        waiting[p] = send(p)
            done = time.monotonic()
            during = poller.stats(t0, done)
            before = poller.stats(t0 - plan.baseline_metadata_s, t0)
    times = sorted(t - t0 for t in acked_at.values())
    return {
        "partitions": partitions,
        "replication_factor": info.replication_factor,
        "create_call_s": round(created, 3),
        "producible_s": round(times[-1], 3) if len(times) == partitions else None,
        "producible_p50_s": round(statistics.median(times), 3) if times else None,
        "not_producible": len(waiting),
        "resends": resends,
        "timeout_s": plan.producible_timeout_s,
        "metadata_during": during,
        "metadata_before": before,
    }


# -- 6. 5,000 idle partitions; the stop ------------------------------------------------------
def settle(cluster: LocalCluster, topics: list[str], timeout: float) -> float:
    """Wait until every partition of ``topics`` has a leader, is created on its nodes and
    has a full ISR; returns the seconds waited."""
    began = time.monotonic()
    with AdminClient(cluster.url) as admin:
        left = list(topics)
        while left:
            info = admin.describe_topic(left[0])
            if all(p.leader.url and p.created_on_node and not p.under_replicated
                   and len(p.isr) == info.replication_factor for p in info.partitions):
                left.pop(0)
                continue
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"{left[0]} not settled within {timeout:.0f}s")
            time.sleep(0.5)
    return time.monotonic() - began


def idle_cpu(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    """Each service's CPU over ``seconds`` of nothing to do, in % of one core, with the
    whole machine's busy share over the same window (what else ran meanwhile)."""
    busy0, total0 = machine_busy_seconds()
    window = CpuWindow(service_pids(cluster))
    time.sleep(seconds)
    window.close()
    busy1, total1 = machine_busy_seconds()
    return {
        "seconds": round(window.seconds, 1),
        "cpu_pct_of_core": {n: round(100 * v / window.seconds, 2) for n, v in window.cpu.items()},
        "machine_busy": round((busy1 - busy0) / max(total1 - total0, 1e-9), 3),
    }


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def timed_stop(cluster: LocalCluster) -> dict[str, Any]:
    """``LocalCluster.stop()`` (what ``eos up`` does on Ctrl-C: its supervisor stops the
    same services the same way), timed in all and per service: a watcher notes when each
    process ends (a zombie counts as ended), since the stop goes one service at a time."""
    pids = service_pids(cluster)
    ended: dict[str, float] = {}
    stopped = threading.Event()

    def watch() -> None:
        while not stopped.is_set() and len(ended) < len(pids):
            for name, pid in pids.items():
                if name not in ended and not _running(pid):
                    ended[name] = time.monotonic()
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, name="stop-watcher", daemon=True)
    t0 = time.monotonic()
    watcher.start()
    cluster.stop()
    total = time.monotonic() - t0
    stopped.set()
    watcher.join(timeout=5)
    order = sorted(ended.items(), key=lambda kv: kv[1])
    each: dict[str, float] = {}
    previous = t0
    for name, at in order:
        each[name] = round(at - previous, 3)
        previous = at
    codes = {name: s.exit_code() for name, s in zip(pids, cluster.services, strict=True)}
    return {"seconds": round(total, 3), "per_service_s": each, "exit_codes": codes,
            "sigkilled": sorted(n for n, c in codes.items() if c == -9)}  # fmt: skip


def run_partitions(plan: WidePlan, root: Path, progress: Progress) -> dict[str, Any]:
    """Rows 5 and 6 on a cluster of their own."""
    out: dict[str, Any] = {}
    cluster = start_cluster(root / "partitions")
    try:
        progress(f"wide: idle CPU over {plan.idle_empty_s:g} s with no topic (the baseline)")
        out["idle_empty"] = idle_cpu(cluster, plan.idle_empty_s)
        n = plan.wide_partitions
        progress(f"wide: a {n:,}-partition topic until producible, GET /v1/metadata meanwhile")
        out["create"] = create_until_producible(cluster, "wide-0", n, plan)
        topics = ["wide-0"]
        creates: list[float] = []
        with AdminClient(cluster.url) as admin:
            for i in range(1, plan.wide_topics):
                progress(f"wide: topic {i + 1} of {plan.wide_topics}, {n:,} partitions")
                began = time.monotonic()
                admin.create_topic(f"wide-{i}", n)
                creates.append(round(time.monotonic() - began, 3))
                topics.append(f"wide-{i}")
        out["more_create_calls_s"] = creates
        progress("wide: waiting for every partition's leader and full ISR")
        out["settle_s"] = round(settle(cluster, topics, plan.settle_timeout_s), 2)
        time.sleep(SETTLE_PAUSE_S)
        out["partitions"] = n * len(topics)
        progress(f"wide: idle CPU over {plan.idle_s:g} s with {n * len(topics):,} partitions")
        out["idle"] = idle_cpu(cluster, plan.idle_s)
        progress("wide: stopping the cluster as eos up does")
        out["stop"] = timed_stop(cluster)
    finally:
        cluster.stop()  # nothing left to stop after timed_stop; every service on an error
    return out


def run_wide(plan: WidePlan, progress: Progress) -> dict[str, Any]:
    """Both halves, each on a cluster of its own; one that fails leaves the other's
    figures. Temporary directories are removed on every path."""
    root = Path(tempfile.mkdtemp(prefix="eos-bench-wide-"))
    res: dict[str, Any] = {"layout": "eos up's 3 nodes, 1 coordinator (SQLite), RF 3",
                           "durability": DURABILITY}  # fmt: skip
    try:
        for key, half in (("throughput", run_clients), ("partitions", run_partitions)):
            t0 = time.monotonic()
            try:
                res[key] = half(plan, root, progress)
            except Exception as exc:
                res[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                progress(f"wide {key} FAILED: {exc!r}"[:500])
            res[f"{key}_bench_s"] = round(time.monotonic() - t0, 1)
    finally:
        t0 = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        # 15,000 replicas' directories: their removal is a visible part of the part's time
        res["cleanup_s"] = round(time.monotonic() - t0, 1)
    return res


# -- report ----------------------------------------------------------------------------------
Row = tuple[str, str, float | None, float | None, float | None]
#: The producer runs of the throughput half, in table order, with their labels.
PRODUCER_RUNS = (
    ("keyed_3", "Producer() defaults, keyed, 3 part. RF=3 (rec/s)"),
    ("keyless_3", "Producer() defaults, keyless, 3 part. RF=3 (rec/s)"),
    ("keyed_100", "Producer() defaults, keyed, 100 part. RF=3 (rec/s)"),
    ("send_many_keyed_3", "send_many() defaults, keyed, 3 part. RF=3 (rec/s)"),
    ("keyed_3_rf1", "Producer() defaults, keyed, 3 part. RF=1 (rec/s)"),
)


def _rate(value: dict[str, Any]) -> str:
    return f"{value['records_per_s']:,}"


def _cpu(value: dict[str, Any]) -> str:
    us = value["cpu_us_per_record"]
    return f"{us['services']:.1f} / {us.get('coordinator', 0):.1f}"


def _client_cpu(value: dict[str, Any]) -> str:
    us = value["cpu_us_per_record"]
    return f"{us['client']:.1f} / {us.get('client_gc', 0):.1f}"


def _idle(idle: dict[str, Any]) -> str:
    pct = idle["cpu_pct_of_core"]
    return "/".join(f"{pct[k]:.1f}" for k in sorted(pct) if k.startswith("node"))


def wide_rows(wide: dict[str, Any]) -> list[Row]:
    """(label, value, p50 ms, p99 ms, over its limit) rows, in table order; a half that
    failed gives one row saying so."""
    rows: list[Row] = []
    t = wide.get("throughput") or {}
    if "error" in t:
        rows.append((f"wide throughput FAILED: {t['error'][:34]}", "", None, None, None))
    elif t:
        accept = t["node_accept_limit"]["records_per_s"] or 1
        noop = t["noop"]
        noop_cpu = noop["noop_produce_typed"]["server_cpu_us_per_record"] or 1
        for key, label in PRODUCER_RUNS:
            run = t[key]
            rows.append((label, _rate(run), None, None, run["records_per_s"] / accept))
            rows.append(("  services' CPU per record: all / coordinator (µs)", _cpu(run), None,
                         None, run["cpu_us_per_record"]["services"] / noop_cpu))  # fmt: skip
            rows.append(("  producer's own CPU per record: all / collector (µs)",
                         _client_cpu(run), None, None, None))  # fmt: skip
            if key == "keyless_3":
                rows.append(("  keyless / keyed", f"{t['keyless_over_keyed']:.3f}", None,
                             None, None))  # fmt: skip
            if key == "keyed_3_rf1":
                rows.append(("  RF=3 acks=all / RF=1", f"{t['rf3_over_rf1']:.3f}", None, None,
                             None))  # fmt: skip
        failed = sum(t[key]["failed"] for key, _ in PRODUCER_RUNS)
        if failed:
            rows.append(("  records not acknowledged in these runs", f"{failed:,}", None, None,
                         None))  # fmt: skip
        lim = t["node_accept_limit"]
        rows.append(("  limit: leader accept, 8 x 1000-rec batches, RF=3", f"{accept:,}",
                     lim["p50_ms"], lim["p99_ms"], None))  # fmt: skip
        rows.append(("  limit: no-op FastAPI produce, typed body (rec/s)",
                     _rate(noop["noop_produce_typed"]), None, None, None))  # fmt: skip
        rows.append(("  limit: no-op FastAPI CPU per record (µs)", f"{noop_cpu:.2f}", None, None,
                     None))  # fmt: skip
        c = t["consume"]
        fetch = noop["noop_fetch"]["records_per_s"] or 1
        rows.append((f"Consumer() defaults, {c['partitions']} part., {c['records']:,} rec",
                     _rate(c), None, None, c["records_per_s"] / fetch))  # fmt: skip
        rows.append(("  services' CPU per record: all / coordinator (µs)", _cpu(c), None, None,
                     None))  # fmt: skip
        rows.append(("  limit: no-op FastAPI canned fetch (rec/s)", _rate(noop["noop_fetch"]),
                     None, None, None))  # fmt: skip
    p = wide.get("partitions") or {}
    if "error" in p:
        rows.append((f"wide partitions FAILED: {p['error'][:34]}", "", None, None, None))
    elif p:
        cr = p["create"]
        producible = "timeout" if cr["producible_s"] is None else f"{cr['producible_s']:.2f}"
        rows.append((f"{cr['partitions']:,}-part. topic RF={cr['replication_factor']}: create "
                     "call / producible (s)", f"{cr['create_call_s']:.2f} / {producible}",
                     None, None, None))  # fmt: skip
        if cr["not_producible"] or cr["resends"]:
            rows.append(("  partitions never producible / sends repeated",
                         f"{cr['not_producible']} / {cr['resends']}", None, None, None))
        d, b = cr["metadata_during"], cr["metadata_before"]
        rows.append(("  GET /v1/metadata meanwhile: calls / failed / max ms",
                     f"{d['calls']}/{d['failures']}/{d['max_ms'] or 0:.0f}", d["p50_ms"],
                     d["p99_ms"], None))  # fmt: skip
        rows.append(("  its largest answer (KB)", f"{d['largest_answer_bytes'] / 1024:,.0f}",
                     None, None, None))  # fmt: skip
        rows.append(("  GET /v1/metadata before the create: calls / max ms",
                     f"{b['calls']}/{b['max_ms'] or 0:.0f}", b["p50_ms"], b["p99_ms"],
                     None))  # fmt: skip
        for key, label in (("idle", f"idle, {p['partitions']:,} part. RF=3"),
                           ("idle_empty", "  idle, no topic (baseline)")):
            idle = p.get(key)
            if not idle:
                continue
            pct = idle["cpu_pct_of_core"]
            rows.append((f"{label}: % of a core, nodes 1/2/3", _idle(idle), None, None, None))
            rows.append(("    coordinator / machine busy (all cores)",
                         f"{pct.get('coordinator', 0):.1f} / {100 * idle['machine_busy']:.0f}%",
                         None, None, None))  # fmt: skip
        st = p["stop"]
        slowest = max(st["per_service_s"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        rows.append(("stop as eos up does on Ctrl-C (s)", f"{st['seconds']:.2f}", None, None,
                     None))  # fmt: skip
        rows.append((f"  the slowest service: {slowest[0]} (s)", f"{slowest[1]:.2f}", None,
                     None, None))  # fmt: skip
        if st["sigkilled"]:
            rows.append(("  SIGKILLed after the 15 s grace", ", ".join(st["sigkilled"]), None,
                         None, None))  # fmt: skip
    return rows


def wide_ratios(wide: dict[str, Any]) -> dict[str, float]:
    """The part's ratios for ``eos bench``'s ratio block."""
    out: dict[str, float] = {}
    t = wide.get("throughput") or {}
    if t and "error" not in t:
        accept = t["node_accept_limit"]["records_per_s"]
        if accept:
            out["wide_producer_default/leader_accept"] = t["keyed_3"]["records_per_s"] / accept
        out["wide_keyless/keyed"] = t["keyless_over_keyed"]
        out["wide_rf3/rf1"] = t["rf3_over_rf1"]
        fetch = t["noop"]["noop_fetch"]["records_per_s"]
        if fetch:
            out["wide_consumer_default/noop_fetch"] = t["consume"]["records_per_s"] / fetch
    return out


def main(argv: list[str] | None = None) -> None:
    from eos_bench.suite import machine, ratios
    from eos_bench.suite_report import emit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (under 2 minutes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    began = time.monotonic()

    def progress(step: str) -> None:
        print(f"... {time.monotonic() - began:5.0f}s {step}", file=sys.stderr, flush=True)

    res: dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine(),
                           "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    res["wide"] = run_wide(QUICK if args.quick else FULL, progress)
    res["bench_seconds"] = round(time.monotonic() - began, 1)
    res["timings_s"] = {"wide": res["bench_seconds"]}
    res["ratios"] = ratios(res)
    emit(res, json_out=args.json, docs=False)


if __name__ == "__main__":  # pragma: no cover - run by hand or by eos bench
    main()
