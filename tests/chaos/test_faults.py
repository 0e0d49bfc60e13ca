"""Exactly-once under each fault: the copy workload runs while the fault strikes several
times, and the checker must find no anomaly in the recorded history. Each fault also
proves it happened (injections counted, zombies fenced, leases taken over, answers
dropped), so a fault that silently did nothing fails the case instead of passing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.cluster import available
from tests.chaos.faults import FAULTS, Fault
from tests.chaos.harness import Row, current_mode, run_case, save_row
from tests.chaos.replica_faults import REPLICA_FAULTS
from tests.support.xdist_groups import CHAOS_LANES

MODE = current_mode()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(MODE.test_timeout_s)]


# Two lanes of fault cases (``tests.support.xdist_groups``), every other case in each. The
# cases are paced (the copiers write at a set rate while the fault strikes), so a lane is
# mostly waiting: in one lane, twenty cases took 12 minutes and ended the parallel phase
# minutes after everything else; handed out first, two lanes end with the rest.
CASES = [
    pytest.param(fault, id=fault.__name__, marks=pytest.mark.xdist_group(CHAOS_LANES[i % 2]))
    for i, fault in enumerate([*FAULTS, *REPLICA_FAULTS])
]


@pytest.mark.parametrize("fault_type", CASES)
def test_exactly_once_under(fault_type: type[Fault], tmp_path: Path, chaos_rows: list[Row]) -> None:
    if fault_type.__name__ == "PostgresRestart" and not available():
        pytest.skip("no PostgreSQL binaries to run a private instance with")
    fault = fault_type()
    report, row, problems = run_case(fault, MODE, tmp_path)
    chaos_rows.append(row)
    save_row(row)
    assert report.ok, report.summary()
    assert not problems, problems
