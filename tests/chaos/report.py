"""The chaos report table, printed at the end of every session that ran fault cases (short
in CI, long by hand), so that each run ends with its evidence.

Under pytest-xdist the cases run in worker processes while the table is printed by the
controller: each worker hands its rows over in ``workeroutput`` when its session ends,
and the controller gathers them as the workers go down. Registered as a plugin by
``tests/conftest.py`` (a package's own conftest is not loaded by an xdist controller,
which collects nothing).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from tests.chaos.harness import Row, current_mode, table

ROWS: list[Row] = []


@pytest.fixture(scope="session")
def chaos_rows() -> list[Row]:
    """Where a fault case puts its row of the table."""
    return ROWS


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the rows to the controller
        workeroutput["chaos_rows"] = [asdict(row) for row in ROWS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", None) or {}
    ROWS.extend(Row(**row) for row in output.get("chaos_rows", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ROWS:
        mode = current_mode()
        terminalreporter.section(f"chaos report ({mode.name} mode, {mode.records} records)")
        terminalreporter.write_line(table(ROWS))
