"""The failure report (``tests/support/failure_report.py``): a failed test is named at the
end of the run with the folders of its services' logs, and written to the file
``scripts/test.sh`` prints last; a passing run names nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

INNER = ("-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "tests.support.failure_report")

PLANTED = '''
from pathlib import Path


def test_passes(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-1.log").write_text("fine")


def test_fails(tmp_path: Path) -> None:
    (tmp_path / "cluster" / "logs").mkdir(parents=True)
    (tmp_path / "cluster" / "logs" / "node-1.log").write_text("what went wrong")
    (tmp_path / "cluster" / "node-1" / "orders-0").mkdir(parents=True)  # a partition's data
    (tmp_path / "cluster" / "node-1" / "orders-0" / "00000000000000000000.log").write_text("")
    assert False, "planted"
'''


def test_a_failed_test_is_named_with_its_service_logs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = tmp_path / "failures.txt"
    monkeypatch.setenv("EOS_TEST_FAILURES", str(report))
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_inprocess(*INNER)
    result.assert_outcomes(passed=1, failed=1)
    lines = report.read_text().splitlines()
    assert lines[0] == "FAILED test_planted.py::test_fails"
    assert len(lines) == 2 and lines[1].startswith("    service logs: ")
    folder = Path(lines[1].split(": ", 1)[1])
    assert (folder / "node-1.log").read_text() == "what went wrong"
    result.stdout.fnmatch_lines(["*failed tests and their service logs*",
                                 "FAILED test_planted.py::test_fails"])  # fmt: skip


def test_a_passing_run_reports_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = tmp_path / "failures.txt"
    monkeypatch.setenv("EOS_TEST_FAILURES", str(report))
    pytester.makepyfile(test_fine="def test_fine() -> None:\n    assert True\n")
    result = pytester.runpytest_inprocess(*INNER)
    result.assert_outcomes(passed=1)
    assert not report.exists()
    assert "service logs" not in result.stdout.str()
