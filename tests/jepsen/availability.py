"""How available the system stayed under faults, from the recorded events alone.

Pure, like the checker. Availability is measured the way a client feels it: the windows in
which no transaction's commit was acknowledged (``Txn.outcome == ok``, at its ``end``).
Counting only successes is deliberate: a fault that makes every request fail fast shows up
as a gap just like one that makes every request hang.

For a fault the figure a reader looks for is "how long did this fault stop the commits",
which starts when the fault was injected and lasts until the first commit after it,
possibly well after the heal (recovery: leader elections, coordinator restarts, client
back-off). So a fault's worst gap is the longest window without a commit that overlaps the
fault, counted from the fault's start at the earliest: a gap that began before the fault
(the commits were merely sparse) is not blamed on it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tests.jepsen.history import Event, Fault, Final, Outcome, Poll, Txn


@dataclass(frozen=True)
class Gap:
    """A window without a successful commit; ``closed`` if a commit ended it (else the run
    did)."""

    start: float
    end: float
    closed: bool = True

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class FaultFigure:
    kind: str
    start: float
    end: float
    detail: str
    worst_gap: float  # longest window without a commit overlapping the fault, from its start
    to_first_commit: float | None  # fault start -> first commit after it (None: none came)
    recovery: float | None  # heal -> first commit after it (None: none came)


@dataclass(frozen=True)
class KindFigure:
    kind: str
    runs: int
    worst_gap: float
    mean_gap: float
    worst_recovery: float  # inf when a fault of the kind was never followed by a commit


@dataclass(frozen=True)
class LatencyPoint:
    end: float
    latency: float
    outcome: Outcome
    kind: str


def span(events: Iterable[Event]) -> tuple[float, float]:
    """The run's first and last moment before the final read (the workload's window)."""
    first, last = math.inf, -math.inf
    final_at = math.inf
    for event in events:
        if isinstance(event, Final):
            final_at = min(final_at, event.at)
            continue
        first = min(first, event.start)
        last = max(last, event.end)
    if first == math.inf:
        return 0.0, 0.0
    if final_at >= first:  # a final read before any event is a misrecorded one: ignore it
        last = min(last, final_at)
    return first, last


def commit_times(events: Iterable[Event]) -> list[float]:
    return sorted(e.end for e in events if isinstance(e, Txn) and e.outcome is Outcome.OK)


def commit_gaps(events: list[Event]) -> list[Gap]:
    """Every window without a successful commit, in time order, from the first event to the
    last one before the final read."""
    first, last = span(events)
    gaps: list[Gap] = []
    previous = first
    for at in commit_times(events):
        if at > last:
            break
        if at > previous:
            gaps.append(Gap(previous, at))
        previous = max(previous, at)
    if last > previous:
        gaps.append(Gap(previous, last, closed=False))
    return gaps


def per_fault(events: list[Event]) -> list[FaultFigure]:
    """Each fault with its window and the commit gap it caused (see the module's doc)."""
    gaps = commit_gaps(events)
    commits = commit_times(events)
    starts = [gap.start for gap in gaps]
    figures: list[FaultFigure] = []
    faults = sorted((e for e in events if isinstance(e, Fault)), key=lambda f: f.start)
    for fault in faults:
        worst = 0.0
        # gaps are disjoint and sorted: begin at the one holding the fault's start
        index = max(0, bisect_right(starts, fault.start) - 1)
        for gap in gaps[index:]:
            if gap.start > fault.end:
                break
            if gap.end >= fault.start:
                worst = max(worst, gap.end - max(gap.start, fault.start))
        figures.append(
            FaultFigure(
                kind=fault.kind,
                start=fault.start,
                end=fault.end,
                detail=fault.detail,
                worst_gap=worst,
                to_first_commit=_first_after(commits, fault.start),
                recovery=_first_after(commits, fault.end),
            )
        )
    return figures


def by_kind(figures: list[FaultFigure]) -> list[KindFigure]:
    """Per fault kind: how often it ran and the worst (and mean) window without a commit."""
    groups: dict[str, list[FaultFigure]] = defaultdict(list)
    for figure in figures:
        groups[figure.kind].append(figure)
    out: list[KindFigure] = []
    for kind in sorted(groups):
        group = groups[kind]
        recoveries = [f.recovery for f in group if f.recovery is not None]
        # a fault no commit ever followed is the worst recovery of all: say so with inf
        worst_recovery = math.inf if len(recoveries) < len(group) else max(recoveries)
        out.append(
            KindFigure(
                kind=kind,
                runs=len(group),
                worst_gap=max(f.worst_gap for f in group),
                mean_gap=sum(f.worst_gap for f in group) / len(group),
                worst_recovery=worst_recovery,
            )
        )
    return out


def latencies(events: Iterable[Event]) -> list[LatencyPoint]:
    """Each transaction's (end, end - start, outcome): the dots of the timeline."""
    return [
        LatencyPoint(e.end, e.end - e.start, e.outcome, e.kind)
        for e in events
        if isinstance(e, Txn)
    ]


def commits_per_second(events: list[Event], bucket: float = 1.0) -> list[tuple[float, int]]:
    """(bucket start, successful commits ended in it) for every bucket of the run, empty
    ones included: an outage must show as a run of zeros, not as a missing stretch."""
    first, last = span(events)
    if last <= first:
        return []
    count = math.ceil((last - first) / bucket) or 1
    counts = [0] * count
    for at in commit_times(events):
        index = int((at - first) // bucket)
        if 0 <= index < count:
            counts[index] += 1
    return [(first + i * bucket, n) for i, n in enumerate(counts)]


def polls_with_errors(events: Iterable[Event]) -> int:
    return sum(1 for e in events if isinstance(e, Poll) and e.error)


def _first_after(commits: list[float], at: float) -> float | None:
    index = bisect_right(commits, at)
    return commits[index] - at if index < len(commits) else None
