"""The output of ``eos bench``: a table (stdout), JSON (``--json``), and the
``docs/benchmarks.md`` page with its PNG plots (``--docs``).

Works on the plain result dictionary of ``bench.suite.run_suite``; every part may be
missing or hold only ``{"error": ...}``, and the writer prints what there is.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, TextIO

import orjson

from eos_bench.suite_clients import sdk_hot_rows, sdk_rows
from eos_bench.suite_wide import wide_rows

# ``--docs`` rewrites the page of the source tree it is run from (the current directory).
DOCS = Path("docs") / "benchmarks.md"
PLOTS = Path("docs") / "benchmarks"
WIDTH = 104


def _ok(res: dict[str, Any], part: str) -> dict[str, Any] | None:
    value = res.get(part)
    if not isinstance(value, dict):
        return None
    if "error" in value and len(value) <= 2 and not value.get("runs"):
        return None
    return value


def _pct(value: float | None) -> str:
    return f"{100 * value:6.1f}%" if value else "    n/a"


def write_table(res: dict[str, Any], out: TextIO) -> None:
    w = out.write
    m = res.get("machine", {})
    w(f"\nEOS benchmarks ({res.get('mode', '?')} run, {res.get('started_at', '')})\n")
    w(f"machine: {m.get('cores')} cores, {m.get('memory_gb')} GB, {m.get('cpu_model', '?')}, "
      f"disk {m.get('disk', {}).get('device', '?')}\n")
    w("shared machine: other work runs alongside, figures are noisy (+/- 20% is common)\n")
    ratios = res.get("ratios", {})
    w("=" * WIDTH + "\n")
    w(f"{'figure':<58}{'value':>16}{'p50 ms':>10}{'p99 ms':>10}{'vs limit':>10}\n")
    w("-" * WIDTH + "\n")

    def row(name: str, value: str, p50: Any = None, p99: Any = None, ratio: Any = None) -> None:
        a = f"{p50:10.2f}" if isinstance(p50, int | float) else " " * 10
        b = f"{p99:10.2f}" if isinstance(p99, int | float) else " " * 10
        r = _pct(ratio) if ratio is not None else ""
        w(f"{name:<58}{value:>16}{a}{b}{r:>10}\n")

    for part in ("node", "coordinator", "scale", "failover", "replication", "auth", "sdk",
                 "spark", "wide"):
        if part in res and _ok(res, part) is None:
            w(f"{part}: FAILED {res[part].get('error', '')[:300]}\n")
    node = _ok(res, "node")
    if node:
        p, lim = node["produce"], node["limits"]
        row("node produce, 8 clients x 1000 rec, durable (rec/s)", f"{p['records_per_s']:,}",
            p["p50_ms"], p["p99_ms"], ratios.get("produce/noop_http"))
        row("  / raw append+fsync of the same frames", "", None, None,
            ratios.get("produce/append_fsync"))
        row("  limit: no-op FastAPI, typed body", f"{lim['noop_produce_typed']['records_per_s']:,}")
        row("  limit: no-op FastAPI, validate_json",
            f"{lim['noop_produce_validate_json']['records_per_s']:,}")
        row("  limit: append+fsync, 1 writer", f"{lim['fsync_single_writer']['records_per_s']:,}")
        row("  limit: append+fsync, 8 writers",
            f"{lim['fsync_group_8_writers']['records_per_s']:,}")
        for b in node["produce_by_batch"]:
            row(f"  growth: {b['records_per_request']} records per request",
                f"{b['records_per_s']:,}", b["p50_ms"], b["p99_ms"])
        f = node["fetch"]
        row(f"node fetch read_committed over {f['log_records']:,} rec",
            f"{f['records_per_s']:,}", f["p50_ms"], f["p99_ms"], ratios.get("fetch/noop_http"))
        row("  limit: no-op FastAPI, canned answer", f"{lim['noop_fetch']['records_per_s']:,}")
        for g in node["fetch_by_log"]:
            row(f"  growth: log of {g['log_records']:,} records", f"{g['records_per_s']:,}",
                g["p50_ms"], g["p99_ms"])
        for r in node["restart"]:
            row(f"node restart, {r['records']:,} records (clean / SIGKILL s)",
                f"{r['clean_stop_s']:.3f}/{r['sigkill_s']:.3f}", None, None,
                max(r["clean_stop_s"], r["sigkill_s"]) / max(1e-9, lim["empty_start_s"]))
        row("  limit: empty node start (s)", f"{lim['empty_start_s']:.3f}")
        w("-" * WIDTH + "\n")
    coord = _ok(res, "coordinator")
    if coord:
        pg = {p["clients"]: p for p in coord.get("pg_limit", [])}
        for r in coord["concurrency"]:
            row(f"coordinator, {r['producers']} producers (committed txn/s)",
                f"{r['txn_per_s']:,.0f}", r["p50_ms"], r["p99_ms"],
                ratios.get(f"txn/pg@{r['producers']}"))
            steps = r.get("steps_p50_ms")
            if steps:
                row("  p50 ms of its steps: add / produce / commit",
                    f"{steps['add']:.1f}/{steps['produce']:.1f}/{steps['commit']:.1f}")
        for p in pg.values():
            row(f"  limit: pgbench one-row update, {p['clients_used']} clients (tps)",
                f"{p['tps']:,.0f}")
        for key, label in (("records_per_txn", "records per txn"),
                           ("partitions_per_txn", "partitions per txn"),
                           ("open_txns", "open txns")):
            for r in coord.get(key, []):
                row(f"  growth (8 producers): {r[key]} {label}", f"{r['txn_per_s']:,.0f}",
                    r["p50_ms"], r["p99_ms"])
        seq = coord.get("partitions_per_txn_sequential")
        if seq:
            row(f"  the same, {seq['partitions_per_txn']} partitions sent one by one",
                f"{seq['txn_per_s']:,.0f}", seq["p50_ms"], seq["p99_ms"])
        for e in coord.get("end_to_end", []):
            row(f"commit returned -> visible read_committed, {e['records_per_txn']} rec",
                f"{e['samples']} samples", e["p50_ms"], e["p99_ms"])
        w("-" * WIDTH + "\n")
    scale = _ok(res, "scale")
    if scale:
        for r in scale.get("runs", []):
            row(f"{r['instances']} coordinator(s), {r['producers']} producers, flow {r['flow']} "
                "(txn/s)", f"{r['txn_per_s']:,.0f}", None, None,
                ratios.get(f"pg_commits/pg@{r['instances']}x{r['producers']}:{r['flow']}"))
            row("  CPU ms per txn: all / coordinators / node / PostgreSQL",
                _cpu_split(r))
            row("  per txn: PostgreSQL commits / node fsyncs; machine busy",
                f"{r['pg_commits_per_txn']:.2f} / {r.get('node_fsyncs_per_txn', 0):.2f}; "
                f"{100 * r['machine_busy']:.0f}%")
        for key, value in scale.get("speedup", {}).items():
            row(f"  speed-up {key}", f"{value:.2f}x")
        w("-" * WIDTH + "\n")
    fo = _ok(res, "failover")
    if fo:
        row("coordinator failover, SIGKILL -> commit on survivor (s)", f"{fo['seconds']:.3f}",
            None, None, ratios.get("failover/lease"))
        row("  limit: lease time (s)", f"{fo['lease_ms'] / 1000:.3f}")
        w("-" * WIDTH + "\n")
    rep = _ok(res, "replication")
    if rep:
        row("produce 1 KB, RF=1 (rec/s)", f"{rep['produce_rf1_records_per_s']:,}")
        row("produce 1 KB, RF=3 acks=all (rec/s)", f"{rep['produce_rf3_records_per_s']:,}",
            None, None, ratios.get("produce_rf3/rf1"))
        e2e = rep["commit_to_visible_rf3"]
        row("commit returned -> visible read_committed, RF=3", f"{e2e['samples']} samples",
            e2e["p50_ms"], e2e["p99_ms"])
        if rep.get("failover_max_s") is not None:
            row("leader SIGKILL -> first write on the new leader (s, max)",
                f"{rep['failover_max_s']:.3f}", None, None, ratios.get("leader_failover/session"))
        row("  limit: node session timeout (s)", f"{rep['session_timeout_s']:.3f}")
        w("-" * WIDTH + "\n")
    auth = _ok(res, "auth")
    if auth:
        for kind, label in (("produce", "produce"), ("fetch", "read_committed fetch")):
            row(f"{label} (rec/s), auth off", f"{auth[f'{kind}_records_per_s_auth_off']:,.0f}")
            row(f"{label} (rec/s), auth and ACLs on",
                f"{auth[f'{kind}_records_per_s_auth_on']:,.0f}", None, None,
                ratios.get(f"{kind}_auth_on/off"))
        row("  limit: no-op FastAPI produce (rec/s)", f"{auth['noop_produce_records_per_s']:,.0f}")
        w("-" * WIDTH + "\n")
    sdk = _ok(res, "sdk")
    if sdk:
        raw = sdk["raw_httpx"]["records_per_s"] or 1
        for label, r in sdk_rows(sdk):
            row(label, f"{r['records_per_s']:,}", r["commit_ms"] if r["transactions"] else None,
                None, r["records_per_s"] / raw)
        row("  limit: raw httpx plain batches", f"{sdk['raw_httpx']['records_per_s']:,}")
        for label, value, over in sdk_hot_rows(sdk):
            row(label, value, None, None, over)
        w("-" * WIDTH + "\n")
    spark = _ok(res, "spark")
    if spark:
        for s in spark.get("runs", []):
            row(f"spark pipeline {s['records']:,} rec, at-least-once (rec/s)",
                f"{s['at_least_once_records_per_s']:,}")
            row(f"spark pipeline {s['records']:,} rec, exactly-once (rec/s)",
                f"{s['exactly_once_records_per_s']:,}", None, None, s["ratio"])
            if "stream_exactly_once_records_per_s" in s:
                row(f"spark stream {s['records']:,} rec, at-least-once (rec/s)",
                    f"{s['stream_at_least_once_records_per_s']:,}")
                row(f"spark stream {s['records']:,} rec, exactly-once (rec/s)",
                    f"{s['stream_exactly_once_records_per_s']:,}", None, None,
                    s["stream_ratio"])
        latency = spark.get("stream_latency")
        if latency:
            row("spark stream commit-to-visible p50 / p95 (s)",
                f"{latency['p50_s']} / {latency['p95_s']}")
        w("-" * WIDTH + "\n")
    wide = _ok(res, "wide")
    if wide:
        w(f"wide: {wide.get('layout', '')}; blocking sdk clients, every option at its "
          f"default\n  durability: {wide.get('durability', '')}\n")
        for label, value, p50, p99, over in wide_rows(wide):
            row(label, value, p50, p99, over)
        w("-" * WIDTH + "\n")
    w("vs limit: the figure over its limit (restart and failover: time over the limit's time; "
      "coordinator: txn/s over pgbench tps;\n  scale: PostgreSQL commits/s over pgbench tps; "
      "auth: on over off; sdk: over raw httpx; "
      "spark exactly-once: over at-least-once). sdk p50 column: mean ms in commit_transaction.\n"
      "  wide: producers over the leader's accept rate, CPU per record over the no-op server's, "
      "the consumer over the no-op fetch.\n")
    w(f"total {res.get('bench_seconds', 0):.0f} s; per part: {res.get('timings_s', {})}\n")


def _cpu_split(run: dict[str, Any]) -> str:
    parts = run.get("cpu_ms_per_txn_by_process", {})
    coordinators = sum(v for k, v in parts.items() if k.startswith("coordinator"))
    return (f"{run['cpu_ms_per_txn']:.2f} / {coordinators:.2f} / "
            f"{parts.get('node', 0):.2f} / {parts.get('postgres', 0):.2f}")


def table(res: dict[str, Any]) -> str:
    buf = io.StringIO()
    write_table(res, buf)
    return buf.getvalue()


def to_json(res: dict[str, Any]) -> str:
    return orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def plots(res: dict[str, Any], directory: Path) -> list[Path]:
    """Throughput against concurrency and latency percentiles; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    coord = _ok(res, "coordinator")
    if coord:
        runs = coord["concurrency"]
        xs = [r["producers"] for r in runs]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [r["txn_per_s"] for r in runs], "o-", label="coordinator committed txn/s")
        pg = [p["tps"] for p in coord.get("pg_limit", [])]
        if len(pg) == len(xs):
            ax.plot(xs, pg, "s--", label="PostgreSQL one-row update tps (limit)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent producers")
        ax.set_ylabel("per second")
        ax.set_title("Throughput against concurrency")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = directory / "coordinator_throughput.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(6, 4))
        for q in ("p50_ms", "p90_ms", "p99_ms"):
            ax.plot(xs, [r[q] for r in runs], "o-", label=f"commit {q[:3]}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent producers")
        ax.set_ylabel("ms (add + produce + commit)")
        ax.set_title("Transaction latency percentiles")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = directory / "coordinator_latency.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    node = _ok(res, "node")
    if node:
        fig, ax = plt.subplots(figsize=(6, 4))
        rows = [("produce", node["produce"])] + [
            (f"fetch {g['log_records']:,}", g) for g in node["fetch_by_log"]]
        names = [n for n, _ in rows]
        for q in ("p50_ms", "p90_ms", "p99_ms"):
            ax.plot(names, [r[q] for _, r in rows], "o-", label=q[:3])
        ax.set_ylabel("ms per request")
        ax.set_title("Storage node request latency percentiles")
        ax.legend()
        ax.grid(True, alpha=0.3)
        path = directory / "node_latency.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def docs_page(res: dict[str, Any], images: list[Path]) -> str:
    m = res.get("machine", {})
    disk = m.get("disk", {})
    lines = [
        "# Benchmarks",
        "",
        "Taken with one command, `eos bench` (full run; `eos bench --quick` takes a few",
        "minutes), which starts the services as processes on this machine, measures the",
        "product and, in the same run, the limits it is compared with: a no-op FastAPI",
        "endpoint parsing the same bodies, raw append+fsync of the same bytes, PostgreSQL",
        "one-row-update transactions per second (pgbench), the start of an empty node, the",
        "coordinator lease time. `eos bench --json` prints the same figures as JSON;",
        "`eos bench --docs` rewrites this page and its plots.",
        "",
        f"Latest run: {res.get('started_at', '?')}, {res.get('mode', '?')} mode, "
        f"{res.get('bench_seconds', 0):.0f} s.",
        "",
        "## Machine",
        "",
        f"- CPU: {m.get('cpu_model', '?')}, {m.get('cores')} cores",
        f"- memory: {m.get('memory_gb')} GB",
        f"- disk: {disk.get('device', '?')} at {disk.get('path', '?')}, "
        f"{disk.get('total_gb', '?')} GB",
        f"- Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}",
        "",
        "The machine is shared: other test suites ran on its two cores during the run, so",
        "the figures are noisy (differences under about 20% between runs mean nothing).",
        "Client, services and PostgreSQL share the same two cores.",
        "",
        "## Figures",
        "",
        "```",
        table(res).strip("\n"),
        "```",
        "",
        "## Plots",
        "",
    ]
    for image in images:
        rel = image.relative_to(DOCS.parent)
        lines += [f"![{image.stem.replace('_', ' ')}]({rel.as_posix()})", ""]
    return "\n".join(lines)


NOTES = "<!-- notes: kept by eos bench --docs -->"


def write_docs(res: dict[str, Any]) -> None:
    """Rewrite the page from ``res``; what follows the notes marker of the old page (the
    reading of the figures, the profile) is kept."""
    images = plots(res, PLOTS)
    notes = ""
    if DOCS.exists() and NOTES in DOCS.read_text():
        notes = DOCS.read_text().split(NOTES, 1)[1]
    DOCS.write_text(docs_page(res, images) + "\n" + NOTES + (notes or "\n"))
    (PLOTS / "latest.json").write_text(to_json(res) + "\n")


def emit(res: dict[str, Any], *, json_out: bool, docs: bool, out: TextIO | None = None) -> None:
    """The table on stdout (on stderr with ``json_out``, stdout then holds the JSON)."""
    stdout = out or sys.stdout
    write_table(res, sys.stderr if json_out else stdout)
    if json_out:
        stdout.write(to_json(res) + "\n")
    if docs:
        write_docs(res)
