"""CPU-seconds per test (``tests/support/cpu_profile.py``): a test's count takes in what
the processes it started burned, not only the test process, and a test that burns nothing
is counted near zero (the count is the test's own, not the machine's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER = ("-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "tests.support.cpu_profile",
         "-p", "no:xdist", "-s")  # fmt: skip

PLANTED = """
import subprocess
import sys
import time


def test_a_child_burns() -> None:
    burn = "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)


def test_idle() -> None:
    time.sleep(0.5)
"""


def test_a_test_is_counted_with_the_processes_it_started(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOS_TEST_CPU", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_subprocess(*INNER)
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "not counting" not in text, text
    seconds = {
        name: float(value)
        for value, name in re.findall(r"^\s+([\d.]+)\s+\S+::(test_\w+)$", text, re.MULTILINE)
    }
    assert seconds["test_a_child_burns"] >= 0.9, text  # the child's second is the test's
    assert seconds["test_idle"] < 0.3, text
