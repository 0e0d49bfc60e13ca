"""``eos demo`` end to end, as a user runs it: a local cluster, sample events, a Structured
Streaming query through ``format("eos")`` whose sink task fails once mid-write, and the
check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import free_port_base

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]  # Spark, beside the others


def test_demo_reports_exactly_once_with_a_retried_task() -> None:
    base = free_port_base((0, 11, 12, 13))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "eos_cli.main",
            "demo",
            "--events",
            "1500",
            "--port-base",
            str(base),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = {line.split("  ")[0].strip(): line for line in result.stdout.splitlines()}
    assert lines["input events"].split()[-1] == "1500"
    assert lines["output records"].split()[2] == "1500"
    assert lines["duplicates"].split()[-1] == "0"
    assert lines["lost"].split()[-1] == "0"
    assert "the last recorded in its transaction" in lines["micro-batches"]
    assert "fired, task retried" in lines["planted task fault"]
    assert "exactly once" in result.stdout
    assert 'writeStream.format("eos")' in result.stdout  # the query a user copies
