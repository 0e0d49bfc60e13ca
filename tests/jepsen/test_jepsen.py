"""The Jepsen-style runs of CI: every fault kind once under a fixed seed, and the planted
bugs each caught by the checker (so a clean verdict means something).

The short run holds each of the eleven fault kinds for six seconds with five of calm after it,
about two minutes of faults; ``scripts/jepsen.sh --minutes N --seed S`` runs longer ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.jepsen.checker import Report
from tests.jepsen.history import Fault, Outcome, Txn
from tests.jepsen.hosts import HostSpec
from tests.jepsen.nemesis import KINDS
from tests.jepsen.planted import FLAG, SERVICE
from tests.jepsen.run import RunPlan, run
from tests.support.xdist_groups import JEPSEN_LANES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: The seed of the CI run (the schedule's order and every target it picks).
SEED = 20261128
#: The workload's pause between transactions here (``RunPlan.pause_s``). At full pace
#: (``scripts/jepsen.sh``'s 0.05 s) the run takes one and a half cores for itself, as much
#: as the rest of the suite beside it leaves; paced, it is still about a thousand
#: transactions under the faults.
PACE_S = 0.4


def _committed(events: Sequence[object], kind: str) -> int:
    return sum(
        1 for e in events if isinstance(e, Txn) and e.kind == kind and e.outcome is Outcome.OK
    )


def _explain(report: Report, summary: Path) -> str:
    lines = [f"{a.kind}: {a.detail} {a.txns[:5]}" for a in report.anomalies[:20]]
    return "\n".join([*lines, f"report: {summary}", summary.read_text()])


@pytest.mark.xdist_group(JEPSEN_LANES[0])
def test_no_anomaly_under_any_fault(tmp_path: Path) -> None:
    plan = RunPlan(SEED, list(KINDS), hold_s=6.0, quiet_s=5.0, warmup_s=6.0, pause_s=PACE_S)
    outcome = run(tmp_path / "run", plan)
    injected = {e.kind for e in outcome.events if isinstance(e, Fault)}
    assert injected == set(KINDS), f"faults that did not happen: {set(KINDS) - injected}"
    # the run did work under the faults: a clean verdict on an idle cluster proves nothing
    assert _committed(outcome.events, "produce") >= 50, _explain(outcome.report, outcome.summary)
    assert _committed(outcome.events, "copy") >= 10, _explain(outcome.report, outcome.summary)
    assert outcome.report.ok, _explain(outcome.report, outcome.summary)


PLANTED = [
    # a leader cut from its followers acknowledges what they never get, and is killed
    # while they are still in its ISR: a follower is elected without those records
    pytest.param("ack-before-isr", ["leader-crash"] * 2, {"lost"}, id="ack-before-isr"),
    pytest.param("hw-reader", [], {"aborted-read", "undecided-read"}, id="hw-reader"),
    pytest.param("one-marker", [], {"partial", "lost"}, id="one-marker"),
]


@pytest.mark.xdist_group(JEPSEN_LANES[1])
@pytest.mark.parametrize(("bug", "faults", "expected"), PLANTED)
def test_the_checker_catches_a_planted(
    bug: str, faults: list[str], expected: set[str], tmp_path: Path
) -> None:
    flags = (FLAG, bug)
    if SERVICE[bug] == "partition_service":
        spec = HostSpec(node_module="tests.jepsen.planted", node_flags=flags)
    else:
        spec = HostSpec(coordinator_module="tests.jepsen.planted", coordinator_flags=flags)
    plan = RunPlan(SEED, faults, hold_s=8.0, quiet_s=4.0, warmup_s=6.0, spec=spec,
                   final_wait_s=10.0, pause_s=PACE_S)  # fmt: skip
    outcome = run(tmp_path / "run", plan)
    found = {anomaly.kind for anomaly in outcome.report.anomalies}
    assert found & expected, f"{bug}: expected one of {expected}, found {found or 'nothing'}"
