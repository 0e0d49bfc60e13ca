"""``eos demo`` end to end, as a user runs it: a local cluster, sample events, the Spark
exactly-once pipeline with a task that fails once, and the check."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def test_demo_reports_exactly_once_with_a_retried_task() -> None:
    base = random.randrange(10_000, 19_900, 100)  # below the ephemeral port range
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
    assert "at the end of the input" in lines["offsets committed"]
    assert "fired, task retried" in lines["planted task fault"]
    assert "exactly once" in result.stdout
