"""The last lines of a failed run: which tests failed, and where their services' logs are.

A failure scrolls away behind the durations and reports printed after it, and the
services' logs that explain it sit in a temporary folder nobody named. So each worker
attaches to a failed test's report the log folders it can find — under the test's
``tmp_path`` and the roots of the cluster factories and clusters it used — and the
controller prints them in its terminal summary and appends them to the file named by
``EOS_TEST_FAILURES`` (``scripts/test.sh`` prints that file last, after the phase times).

Registered as a plugin by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "EOS_TEST_FAILURES"
_KEY = "service_logs"
#: How many log folders a failure names at most (a cluster has a handful).
MOST = 12


def _roots(item: pytest.Item) -> Iterator[Path]:
    """The folders a test's services may have written under."""
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    for value in funcargs.values():
        if isinstance(value, Path):
            yield value
        root = getattr(value, "root", None)
        if isinstance(root, Path):
            yield root


def log_folders(item: pytest.Item) -> list[str]:
    """Folders holding services' logs (``name.log``) under the test's roots. A storage
    node's segment files end in ``.log`` too, but are named by their base offset (digits
    only): those folders are data, not logs."""
    found: list[str] = []
    for root in _roots(item):
        if not root.is_dir():
            continue
        for log in sorted(root.rglob("*.log")):
            folder = str(log.parent)
            if log.stem.isdigit() or folder in found:
                continue
            found.append(folder)
            if len(found) >= MOST:
                return found
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        report.user_properties.append((_KEY, log_folders(item)))


class FailureReport:
    """The controller's (or a lone process's) record of failed tests."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, str, list[str]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        folders: list[str] = next((v for k, v in report.user_properties if k == _KEY), [])
        self.failed.append((report.nodeid, report.when, list(folders)))

    def lines(self) -> list[str]:
        out = []
        for nodeid, when, folders in self.failed:
            where = f" ({when})" if when != "call" else ""
            out.append(f"FAILED {nodeid}{where}")
            out += [f"    service logs: {folder}" for folder in folders]
        return out

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.failed:
            return
        lines = self.lines()
        terminalreporter.section("failed tests and their service logs")
        for line in lines:
            terminalreporter.write_line(line)
        path = os.environ.get(ENV)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None:  # the controller, or no xdist at all
        config.pluginmanager.register(FailureReport(), "eos-failure-report")
