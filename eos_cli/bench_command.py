"""``eos bench``: every benchmark of the product against the limits of the machine.

The benchmark code lives in ``bench/`` at the root of the source tree (it starts the
services as processes, PostgreSQL databases, Spark); this module only registers the
command and hands over to ``bench.suite``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("node", "coordinator", "failover", "auth", "sdk", "spark")


def _bench_on_path() -> None:
    if not (ROOT / "bench" / "suite.py").exists():
        raise typer.BadParameter("eos bench needs the source tree (bench/ next to eos_cli/)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def bench(
    quick: bool = typer.Option(False, "--quick", help="A short run (a few minutes)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON on stdout (the table then goes to stderr)."
    ),
    docs: bool = typer.Option(
        False, "--docs", help="Rewrite docs/benchmarks.md and its plots from this run."
    ),
    only: str = typer.Option(
        ",".join(PARTS), "--only", help="Comma-separated parts to run: " + ", ".join(PARTS)
    ),
) -> None:
    """Benchmark node, coordinator, failover, SDK and Spark against the machine's limits:
    no-op FastAPI, raw append+fsync, PostgreSQL one-row updates (pgbench)."""
    parts = [p.strip() for p in only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise typer.BadParameter(f"unknown parts: {', '.join(unknown)}", param_hint="--only")
    _bench_on_path()
    argv = ["--only", ",".join(parts)]
    argv += ["--quick"] if quick else []
    argv += ["--json"] if json_out else []
    argv += ["--docs"] if docs else []
    # Imported by name: bench/ is not a package of the distribution (and not type-checked
    # with it).
    suite = importlib.import_module("bench.suite")
    suite.main(argv)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
