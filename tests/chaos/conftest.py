"""Fixtures of the chaos tests: the rows of the report table, printed at the end of the
session so every run (short in CI, long by hand) ends with its evidence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.harness import Row, current_mode, table

_ROWS: list[Row] = []


@pytest.fixture(scope="session")
def chaos_rows() -> Iterator[list[Row]]:
    yield _ROWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _ROWS:
        mode = current_mode()
        terminalreporter.section(f"chaos report ({mode.name} mode, {mode.records} records)")
        terminalreporter.write_line(table(_ROWS))
