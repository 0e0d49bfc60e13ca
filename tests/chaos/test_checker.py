"""The checker finds what is planted: every rule fires on a history built to break it, and
stays quiet on a clean one. A checker that cannot fail proves nothing about the runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.chaos.checker import (
    ABORTED_READ,
    COMMITTED_OFFSET,
    CORRUPT,
    DUPLICATE,
    KINDS,
    LOST,
    OFFSET_BACKWARDS,
    ORDER,
    PARTIAL,
    UNCOMMITTED_READ,
    UNREAD,
    VANISHED,
    Status,
    check,
)
from tests.chaos.history import CopierHistory, History, OutputValue, Read

pytestmark = pytest.mark.unit


@dataclass
class Run:
    """A clean two-partition run written out as the workload would record it: each
    copier makes transactions of 4 records, every third one aborted on purpose; the
    reader sees each committed transaction 10 ms after its commit was acknowledged."""

    per_partition: int = 24
    size: int = 4
    inputs: dict[int, list[str]] = field(default_factory=dict)
    copiers: list[CopierHistory] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    output: dict[int, list[tuple[int, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clock = 100.0
        for p in (0, 1):
            self.inputs[p] = [f"in-{p}-{o}" for o in range(self.per_partition)]
            self.output[p] = []
            events: list[dict[str, Any]] = [{"e": "position", "t": clock, "offset": 0}]
            position, txn, next_out = 0, 0, 0
            while position < self.per_partition:
                txn += 1
                abort = txn % 3 == 0
                last = position + self.size - 1
                events.append(
                    self._event("begin", clock, txn, abort=abort, first=position, last=last)
                )
                values = [
                    OutputValue(p, o, p, 0, txn, abort, self.inputs[p][o]).encode()
                    for o in range(position, last + 1)
                ]
                next_out += len(values)  # written either way; an abort's records are hidden
                if abort:
                    events.append(self._event("abort_ok", clock + 1, txn))
                else:
                    events.append(self._event("commit_start", clock + 1, txn))
                    events.append(self._event("commit_ok", clock + 2, txn))
                    first_out = next_out - len(values)
                    for i, value in enumerate(values):
                        self.output[p].append((first_out + i, value))
                        self.reads.append(Read(clock + 2.01, p, first_out + i, value))
                    position = last + 1
                next_out += 1  # the marker
                clock += 3
            self.copiers.append(CopierHistory(p, 0, events))

    @staticmethod
    def _event(kind: str, t: float, txn: int, **fields: Any) -> dict[str, Any]:
        return {"e": kind, "t": t, "txn": txn, **fields}

    def history(self, committed: dict[int, int | None] | None = None) -> History:
        final = committed or {p: len(v) for p, v in self.inputs.items()}
        return History(self.inputs, self.copiers, self.reads, self.output, final)

    def hidden(self, partition: int) -> list[tuple[int, str]]:
        """Records of partition's meant-to-abort transactions, at made-up offsets past
        the end (where a broken node might show them)."""
        end = self.output[partition][-1][0] + 100
        values = [
            OutputValue(partition, 0, partition, 0, 3, True, self.inputs[partition][0]).encode()
        ]
        return [(end + i, v) for i, v in enumerate(values)]


def _kinds(history: History) -> dict[str, int]:
    report = check(history)
    return {k: report.count(k) for k in KINDS if report.count(k)}


def test_a_clean_history_has_no_anomaly() -> None:
    report = check(Run().history())
    assert report.ok, report.summary()
    assert report.statuses[Status.COMMITTED] > report.statuses[Status.NOT_COMMITTED] > 0


def test_a_planted_duplicate_loss_and_aborted_read_are_all_reported() -> None:
    run = Run()
    p0, p1 = run.output[0], run.output[1]
    # duplicate: input (0, 1) copied a second time at the end of partition 0
    dup_value = p0[1][1]
    p0.append((p0[-1][0] + 1, dup_value))
    run.reads.append(Read(1e6, 0, p0[-1][0], dup_value))
    # loss: input (1, 5) never reached the output (nor the reader)
    lost = next(i for i, (_, v) in enumerate(p1) if OutputValue.decode(v).in_offset == 5)
    gone_offset, _ = p1.pop(lost)
    run.reads = [r for r in run.reads if (r.partition, r.offset) != (1, gone_offset)]
    # aborted read: the reader saw a record of a transaction meant to be aborted
    offset, value = run.hidden(1)[0]
    run.reads.append(Read(1e6, 1, offset, value))

    report = check(run.history())
    assert report.count(DUPLICATE) == 1, report.summary()
    assert report.count(LOST) == 1, report.summary()
    assert report.count(ABORTED_READ) == 1, report.summary()
    assert "(0, 1)" in next(a.detail for a in report.anomalies if a.kind == DUPLICATE)
    assert "(1, 5)" in next(a.detail for a in report.anomalies if a.kind == LOST)


def test_a_record_of_a_transaction_left_open_by_a_killed_copier_is_an_aborted_read() -> None:
    run = Run()
    # the copier of partition 0 began txn 99 and died before it asked to commit
    run.copiers[0].events.append(
        {"e": "begin", "t": 1e5, "txn": 99, "abort": False, "first": 24, "last": 24}
    )
    value = OutputValue(0, 0, 0, 0, 99, False, run.inputs[0][0]).encode()
    run.reads.append(Read(1e6, 0, 10_000, value))
    assert _kinds(run.history()).get(ABORTED_READ) == 1


def test_a_read_before_the_commit_was_requested_is_reported() -> None:
    run = Run()
    first = run.reads[0]
    run.reads[0] = Read(first.t - 1.5, first.partition, first.offset, first.value)
    assert _kinds(run.history()) == {UNCOMMITTED_READ: 1}


def test_a_read_of_an_in_doubt_commit_is_allowed_but_not_a_premature_one() -> None:
    run = Run()
    events = run.copiers[0].events
    ok = next(e for e in events if e["e"] == "commit_ok")
    events.remove(ok)  # killed while the commit request was out: in doubt
    assert check(run.history()).ok
    early = run.reads[0]
    run.reads[0] = Read(ok["t"] - 5, early.partition, early.offset, early.value)
    assert _kinds(run.history()) == {UNCOMMITTED_READ: 1}


def test_offsets_going_backwards_are_reported() -> None:
    run = Run()
    run.reads.insert(3, run.reads[1])
    kinds = _kinds(run.history())
    assert kinds == {OFFSET_BACKWARDS: 1}


def test_records_out_of_input_order_are_reported() -> None:
    run = Run()
    p0 = run.output[0]
    (o1, v1), (o2, v2) = p0[1], p0[2]
    p0[1], p0[2] = (o1, v2), (o2, v1)
    run.reads = [
        Read(r.t, r.partition, r.offset, dict(p0)[r.offset]) if r.partition == 0 else r
        for r in run.reads
    ]
    assert _kinds(run.history()) == {ORDER: 1}


def test_committed_offsets_that_do_not_match_the_output_are_reported() -> None:
    run = Run()
    assert _kinds(run.history({0: 24, 1: 20})) == {COMMITTED_OFFSET: 1}
    # an instance that started from an offset no transaction ends at (records skipped)
    run.copiers.append(CopierHistory(1, 1, [{"e": "position", "t": 50.0, "offset": 6}]))
    assert _kinds(run.history()) == {COMMITTED_OFFSET: 1}


def test_an_instance_starting_before_an_acknowledged_commit_is_reported() -> None:
    run = Run()
    # instance 1 read offset 4 although txn 2 (up to 8) had been acknowledged before
    run.copiers.append(CopierHistory(0, 1, [{"e": "position", "t": 1e6, "offset": 4}]))
    assert _kinds(run.history()) == {COMMITTED_OFFSET: 1}


def test_a_partly_visible_transaction_is_reported() -> None:
    run = Run()
    gone = run.output[0].pop(2)
    run.reads = [r for r in run.reads if (r.partition, r.offset) != (0, gone[0])]
    kinds = _kinds(run.history())
    assert kinds.get(PARTIAL) == 1 and kinds.get(LOST) == 1, kinds


def test_a_changed_payload_is_reported() -> None:
    run = Run()
    offset, value = run.output[1][0]
    changed = OutputValue.decode(value)
    bad = OutputValue(
        changed.in_partition,
        changed.in_offset,
        changed.copier,
        changed.instance,
        changed.txn,
        False,
        "tampered",
    ).encode()
    run.output[1][0] = (offset, bad)
    run.reads = [
        Read(r.t, r.partition, r.offset, bad) if (r.partition, r.offset) == (1, offset) else r
        for r in run.reads
    ]
    assert _kinds(run.history()) == {CORRUPT: 1}


@pytest.mark.parametrize("how", ["missed", "different"])
def test_the_reader_and_the_output_must_agree(how: str) -> None:
    run = Run()
    if how == "missed":
        run.reads.pop(5)
        assert _kinds(run.history()) == {UNREAD: 1}
    else:
        r = run.reads[5]
        run.reads[5] = Read(r.t, r.partition, r.offset, run.reads[6].value)
        assert VANISHED in _kinds(run.history())
