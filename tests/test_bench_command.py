"""``eos bench``: the command is registered, and the table/JSON writer works on a small
fake result (the benchmark itself is not run here)."""

from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from eos_bench.suite import PARTS, ratios
from eos_bench.suite_report import docs_page, emit, table
from eos_cli.bench_command import PARTS as CLI_PARTS
from eos_cli.main import app

pytestmark = pytest.mark.unit


def _load(rate: int) -> dict[str, object]:
    return {"records_per_s": rate, "mb_per_s": 1.0, "requests": 10, "p50_ms": 1.0,
            "p90_ms": 2.0, "p99_ms": 3.0, "server_cpu": 0.5, "client_cpu": 0.1}


def _scale_run(instances: int, pg_commits_per_s: float) -> dict[str, object]:
    return {"instances": instances, "producers": 8, "flow": "v2", "committed": 100,
            "txn_per_s": 400.0 * instances, "cpu_ms_per_txn": 1.5,
            "cpu_ms_per_txn_by_process": {"coordinator-0": 0.7, "node": 0.5, "postgres": 0.3},
            "pg_commits_per_txn": 0.4, "pg_commits_per_s": pg_commits_per_s,
            "load_generator_cpu_ms_per_txn": 0.2, "machine_busy": 0.9, "retries": 0}


def fake_result() -> dict[str, object]:
    run = {"producers": 8, "records_per_txn": 1, "partitions_per_txn": 1, "open_txns": 10,
           "committed": 100, "txn_per_s": 500.0, "p50_ms": 10.0, "p90_ms": 15.0,
           "p99_ms": 20.0, "cpu": {}, "retries": 0}
    res: dict[str, object] = {
        "mode": "quick",
        "started_at": "2026-01-01 00:00:00 UTC",
        "machine": {"cores": 2, "memory_gb": 8.0, "cpu_model": "Fake CPU",
                    "disk": {"device": "/dev/fake (ext4)", "path": "/tmp", "total_gb": 10}},
        "node": {
            "produce": {**_load(100_000), "fsyncs": 5},
            "produce_by_batch": [{"records_per_request": 100, **_load(50_000)}],
            "fetch": {"log_records": 1000, **_load(300_000)},
            "fetch_by_log": [{"log_records": 1000, **_load(300_000)}],
            "restart": [{"records": 100_000, "clean_stop_s": 0.5, "sigkill_s": 0.6}],
            "limits": {"empty_start_s": 0.4, "noop_produce_typed": _load(200_000),
                       "noop_produce_validate_json": _load(250_000),
                       "noop_fetch": _load(600_000),
                       "fsync_single_writer": _load(1_000_000),
                       "fsync_group_8_writers": _load(2_000_000)},
        },
        "coordinator": {
            "concurrency": [run],
            "records_per_txn": [run], "partitions_per_txn": [run], "open_txns": [run],
            "end_to_end": [{"records_per_txn": 1, "samples": 5, "p50_ms": 1.0, "p99_ms": 2.0}],
            "pg_limit": [{"clients": 8, "clients_used": 8, "tps": 2000.0, "tool": "pgbench"}],
        },
        "scale": {
            "runs": [_scale_run(1, 150.0), _scale_run(2, 270.0)],
            "speedup": {"2/1@8:v2": 1.8},
        },
        "failover": {"lease_ms": 2000, "seconds": 2.5, "attempts": 3},
        "sdk": {"error": "RuntimeError: broken on purpose"},
        "timings_s": {"node": 1.0},
        "bench_seconds": 12.0,
    }
    res["ratios"] = ratios({k: v for k, v in res.items() if k != "sdk"})
    return res


def test_bench_help() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--quick", "--json", "--docs", "--only"):
        assert option in result.output


def test_bench_rejects_unknown_part() -> None:
    result = CliRunner().invoke(app, ["bench", "--only", "nonsense"])
    assert result.exit_code != 0


def test_ratios_of_fake_result() -> None:
    r = fake_result()["ratios"]
    assert isinstance(r, dict)
    assert r["produce/noop_http"] == 0.4
    assert r["produce/append_fsync"] == 0.05
    assert r["txn/pg@8"] == 0.25
    assert r["failover/lease"] == 1.25
    assert r["pg_commits/pg@2x8:v2"] == 0.135


def test_scale_rows_and_speedups() -> None:
    from eos_bench.suite_scale import speedups

    text = table(fake_result())
    assert "2 coordinator(s), 8 producers, flow v2 (txn/s)" in text and "800" in text
    assert "1.50 / 0.70 / 0.50 / 0.30" in text
    assert "speed-up 2/1@8:v2" in text
    runs = [{"instances": 1, "producers": 32, "flow": "v2", "txn_per_s": 500.0},
            {"instances": 2, "producers": 32, "flow": "v2", "txn_per_s": 850.0},
            {"instances": 2, "producers": 32, "flow": "v1", "txn_per_s": 900.0}]
    assert speedups(runs) == {"2/1@32:v2": 1.7}


def test_table_and_json_writer() -> None:
    res = fake_result()
    text = table(res)
    assert "node produce" in text and "100,000" in text
    assert "coordinator, 8 producers" in text and " 25.0%" in text
    assert "sdk: FAILED" in text
    out = io.StringIO()
    emit(res, json_out=True, docs=False, out=out)
    assert json.loads(out.getvalue())["failover"]["seconds"] == 2.5
    out = io.StringIO()
    emit(res, json_out=False, docs=False, out=out)
    assert "coordinator failover" in out.getvalue()


def test_docs_page_names_the_machine() -> None:
    page = docs_page(fake_result(), [])
    assert "Fake CPU" in page and "2 cores" in page and "/dev/fake" in page


def test_sdk_rows_and_ratios() -> None:
    from bench.suite_clients import sdk_rows

    def r(rate: int, txns: int = 0, cost: float | None = None) -> dict[str, object]:
        return {"name": "x", "records_per_s": rate, "mb_per_s": 1.0, "transactions": txns,
                "commit_ms": 5.0, "records_per_txn": None, "cost_vs_idempotent": cost}

    sdk = {"raw_httpx": r(1000), "idempotent": r(800),
           "transactional": [{"commit_interval_ms": 10, **r(600, 10, 0.25)}]}
    rows = sdk_rows(sdk)
    assert [label.split(",")[0] for label, _ in rows] == [
        "sdk idempotent producer", "sdk transactional"]
    assert "cost +25%" in rows[1][0]
    got = ratios({"sdk": sdk})
    assert got["sdk_idempotent/raw_httpx"] == 0.8 and got["sdk_txn@10ms/raw_httpx"] == 0.6
    assert "sdk transactional, commit every 10 ms" in table({"sdk": sdk})


def test_the_command_offers_every_part_of_the_suite() -> None:
    assert CLI_PARTS == PARTS
    result = CliRunner().invoke(app, ["bench", "--only", "nonsense"])
    assert result.exit_code != 0
    assert "unknown parts: nonsense" in result.output
