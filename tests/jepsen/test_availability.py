"""The availability figures of a Jepsen-style run (``tests/jepsen/availability.py``): the
windows without a commit, each fault's share of them and the time to the first commit after
it, and commits per second, computed from hand-made histories whose answers are known."""

from __future__ import annotations

import pytest

from tests.jepsen.availability import by_kind, commit_gaps, commits_per_second, per_fault
from tests.jepsen.history import Event, Fault, Final, Intent, Outcome, Poll, Txn

pytestmark = pytest.mark.unit


def _txns(*spans: tuple[float, float], outcome: Outcome = Outcome.OK) -> list[Event]:
    return [
        Txn("p1", f"p1.{s}", "produce", Intent.COMMIT, s, e, outcome, commit_at=e - 0.1)
        for s, e in spans
    ]


def test_commit_gaps_run_from_the_first_event_to_the_last_before_the_final_read() -> None:
    events = _txns((0.0, 1.0), (1.5, 2.0), (4.0, 5.0)) + _txns((3.0, 3.5), outcome=Outcome.FAIL)
    events += [Poll("r1", 5.5, 6.0), Final("final", 7.0)]
    gaps = commit_gaps(events)
    expected = [(0.0, 1.0, True), (1.0, 2.0, True), (2.0, 5.0, True), (5.0, 6.0, False)]
    assert [(g.start, g.end, g.closed) for g in gaps] == expected
    assert max(g.length for g in gaps) == 3.0


def test_per_fault_counts_from_the_fault_until_the_next_commit() -> None:
    events = [*_txns((0.0, 1.0), (1.5, 2.0), (4.0, 5.0)), Poll("r1", 5.5, 8.0)]
    events += [
        Fault("kill", 2.5, 3.0),  # the gap 2.0-5.0 holds it: 2.5 s of it are the fault's
        Fault("pause", 6.0, 6.5),  # no commit ever came after it
        Fault("kill", 0.2, 0.4),
    ]
    figures = {(f.kind, f.start): f for f in per_fault(events)}
    kill = figures[("kill", 2.5)]
    assert kill.worst_gap == pytest.approx(2.5)
    assert kill.to_first_commit == pytest.approx(2.5) and kill.recovery == pytest.approx(2.0)
    pause = figures[("pause", 6.0)]
    assert pause.worst_gap == pytest.approx(2.0) and pause.recovery is None
    assert figures[("kill", 0.2)].worst_gap == pytest.approx(0.8)
    kinds_ = {k.kind: k for k in by_kind(list(figures.values()))}
    assert kinds_["kill"].runs == 2 and kinds_["kill"].worst_gap == pytest.approx(2.5)
    assert kinds_["pause"].worst_recovery == float("inf")


def test_commits_per_second_keeps_the_empty_seconds() -> None:
    events = _txns((0.0, 0.5), (0.6, 0.7), (2.0, 3.5))
    assert commits_per_second(events) == [(0.0, 2), (1.0, 0), (2.0, 0), (3.0, 1)]
