"""``eos bench``: every benchmark of the product against the limits of the machine.

The benchmark code lives in ``bench/`` of the source tree and is installed with the
product as ``eos_bench`` (it starts the services as processes, PostgreSQL databases,
Spark); this module only registers the command and hands over to ``eos_bench.suite``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

#: The parts of ``eos_bench.suite.PARTS``, restated so that ``eos --help`` does not import
#: the benchmarks (tests/test_bench_command.py keeps the two equal).
PARTS = ("node", "coordinator", "scale", "failover", "replication", "auth", "sdk", "spark",
         "wide", "groups")


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
    """Benchmark node, coordinators (scaling out included), failover, replication, SDK and
    Spark against the machine's limits: no-op FastAPI, raw append+fsync, PostgreSQL
    one-row updates (pgbench)."""
    parts = [p.strip() for p in only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise typer.BadParameter(f"unknown parts: {', '.join(unknown)}", param_hint="--only")
    if docs and not Path("docs", "benchmarks.md").exists():
        raise typer.BadParameter(
            "--docs rewrites docs/benchmarks.md: run it from the root of the source tree",
            param_hint="--docs",
        )
    argv = ["--only", ",".join(parts)]
    argv += ["--quick"] if quick else []
    argv += ["--json"] if json_out else []
    argv += ["--docs"] if docs else []
    # Imported by name: eos_bench is not type-checked with the product.
    suite = importlib.import_module("eos_bench.suite")
    suite.main(argv)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
