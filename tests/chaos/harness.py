"""One chaos run from start to verdict, the two modes, and the report table.

A run: make the fault's database and cluster, seed the input, start the copiers and the
reader, inject the fault ``injections`` times at evenly spaced points of the copy (so each
lands while copiers are at work), let the copy finish, gather the history and check it.

The short mode (default) is what CI runs: a few thousand records, three injections per
fault. ``EOS_CHAOS_LONG=1`` is the long mode, run by hand: 100,000 input records (or
``EOS_CHAOS_RECORDS``), eight injections per fault, transactions of 200-500 records. Both
pace the copiers (200 and 500 records/s each) so that every injection, the pauses included,
lands while copiers are still at work.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.chaos.checker import ABORTED_READ, DUPLICATE, LOST, Report, Status, check
from tests.chaos.faults import Fault, commit_times, run_dir
from tests.chaos.workload import Workload, WorkloadConfig
from tests.support.cluster import ClusterFactory


@dataclass(frozen=True)
class Mode:
    name: str
    records: int
    injections: int
    txn_min: int
    txn_max: int
    deadline_s: float
    pace: float = 0.0

    @property
    def test_timeout_s(self) -> int:
        """The pytest-timeout of one fault case."""
        return int(self.deadline_s * 2 + 120)


SHORT = Mode(
    "short", records=6000, injections=3, txn_min=100, txn_max=300, deadline_s=150, pace=200
)
LONG = Mode(
    "long", records=100_000, injections=8, txn_min=200, txn_max=500, deadline_s=1200, pace=500
)


def current_mode() -> Mode:
    if os.environ.get("EOS_CHAOS_LONG", "") not in ("", "0"):
        records = int(os.environ.get("EOS_CHAOS_RECORDS", LONG.records))
        return Mode(LONG.name, records, LONG.injections, LONG.txn_min, LONG.txn_max,
                    LONG.deadline_s, LONG.pace)  # fmt: skip
    return SHORT


@dataclass
class Row:
    """One line of the report table."""

    fault: str
    runs: int
    records: int
    duplicates: int
    lost: int
    aborted_reads: int
    other: int
    committed_txns: int
    aborted_txns: int
    in_doubt_txns: int
    restarts: int
    longest_commit_gap_s: float
    seconds: float
    notes: str

    @classmethod
    def of(cls, fault: Fault, report: Report, workload: Workload, seconds: float) -> Row:
        notes = ", ".join(f"{k} {v}" for k, v in sorted(fault.counts.items()) if k != "injected")
        return cls(
            fault=fault.name,
            runs=fault.counts["injected"],
            records=report.records,
            duplicates=report.count(DUPLICATE),
            lost=report.count(LOST),
            aborted_reads=report.count(ABORTED_READ),
            other=report.other,
            committed_txns=report.statuses.get(Status.COMMITTED, 0),
            aborted_txns=report.statuses.get(Status.NOT_COMMITTED, 0),
            in_doubt_txns=report.statuses.get(Status.IN_DOUBT, 0),
            restarts=workload.restarts(),
            longest_commit_gap_s=round(longest_gap(commit_times(workload.dir)), 2),
            seconds=round(seconds, 1),
            notes=notes,
        )


def longest_gap(times: list[float]) -> float:
    """The longest time between two consecutive commits: how long the pipeline stood."""
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def run_case(fault: Fault, mode: Mode, root: Path) -> tuple[Report, Row, list[str]]:
    """Run the workload under ``fault``; returns the checker's report, the table row and
    what went wrong with the fault itself (it did not inject, a zombie was not fenced)."""
    started = time.monotonic()
    config = WorkloadConfig(
        records=mode.records,
        txn_min=mode.txn_min,
        txn_max=mode.txn_max,
        txn_timeout_ms=fault.txn_timeout_ms,
        deadline_s=mode.deadline_s,
        pace=mode.pace if fault.pace is None else min(mode.pace, fault.pace),
    )
    with fault.database() as database_url, ClusterFactory(root) as clusters:
        cluster = clusters(fault.spec, database=database_url)
        workload = Workload(cluster, run_dir(root, fault), config)
        try:
            workload.prepare()
            workload.start()
            for k in range(mode.injections):
                workload.wait_copied(fault.starts_at(k, mode.injections))
                fault.inject(workload, k)
            history = workload.finish()
        except BaseException as exc:
            exc.add_note(cluster.logs())
            exc.add_note(workload.tails())
            raise
        finally:
            workload.stop()
            cluster.stop()
    report = check(history)
    row = Row.of(fault, report, workload, time.monotonic() - started)
    return report, row, fault.problems(workload, mode.injections, history)


COLUMNS = ("fault", "runs", "records", "duplicates", "lost", "aborted_reads", "other")


def table(rows: list[Row]) -> str:
    """The report table in Markdown: the headline columns, then the run's details."""
    head = [
        *COLUMNS, "txns committed/aborted/in doubt", "longest gap between commits (s)",
        "copier restarts", "seconds", "notes",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(getattr(row, c)) for c in COLUMNS]
        cells.append(f"{row.committed_txns}/{row.aborted_txns}/{row.in_doubt_txns}")
        gap = f"{row.longest_commit_gap_s:.2f}"
        cells += [gap, str(row.restarts), f"{row.seconds:.0f}", row.notes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_row(row: Row) -> None:
    """Append the row to ``$EOS_CHAOS_REPORT`` (JSON lines) when it is set."""
    target = os.environ.get("EOS_CHAOS_REPORT")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")


def load_rows(path: Path) -> list[Row]:
    if not path.exists():
        return []
    return [Row(**json.loads(line)) for line in path.read_text().splitlines() if line]
