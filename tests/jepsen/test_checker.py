"""The Jepsen-style checker finds what is planted: a clean history checks clean, and every
anomaly kind fires on a history built to hold it, naming the transactions involved. A
checker that cannot fail proves nothing about the runs it passes.

The histories come from ``Run``, a small model of the system that writes down what the
workload processes would record: sends append to a partition's log at once (invisible until
their transaction commits, each decision taking one more offset for its marker), readers
poll whatever is visible past their positions, copiers copy visible input and commit the
next input offset with their output. The three system bugs the planted-bug runs inject
(``planted.py``) are modelled here too, so each is known to be caught by the checker alone.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.jepsen import checker
from tests.jepsen.checker import Report, check
from tests.jepsen.history import (
    COPY_TOPIC,
    DATA_TOPIC,
    Event,
    Fault,
    Final,
    Intent,
    Outcome,
    Poll,
    Txn,
    Write,
    copy_value,
    decode,
    encode,
    tp,
)
from tests.jepsen.report import write_report

pytestmark = pytest.mark.unit

PARTITIONS = 4
Part = tuple[str, int]
PARTS: list[Part] = [(t, p) for t in (DATA_TOPIC, COPY_TOPIC) for p in range(PARTITIONS)]


@dataclass
class Entry:
    offset: int
    value: str
    visible: bool = False  # its transaction committed


@dataclass
class Run:
    """A run of the model, one step at a time; ``events()`` is its history."""

    clock: float = 0.0
    logs: dict[Part, list[Entry]] = field(default_factory=lambda: {p: [] for p in PARTS})
    ends: dict[Part, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    entries: dict[str, Entry] = field(default_factory=dict)
    txns: list[Txn] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    positions: dict[str, dict[Part, int]] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)
    seq: int = 0

    def tick(self, dt: float = 0.01) -> float:
        self.clock = round(self.clock + dt, 4)
        return self.clock

    def _begin(self, kind: str, intent: Intent, outcome: Outcome, writes: list[Write]) -> Txn:
        """Begin and send ``writes`` (``{txn}``: its name), appended at once, invisible."""
        self.seq += 1
        process = "p1" if kind == "produce" else "c1"
        txn = Txn(process, f"{process}.{self.seq}", kind, intent, self.tick(), 0.0, outcome)
        txn.writes = [(t, p, v.format(txn=txn.txn)) for t, p, v in writes]
        for topic, partition, value in txn.writes:
            entry = self.entries[value] = Entry(self.ends[(topic, partition)], value)
            self.logs[(topic, partition)].append(entry)
            self.ends[(topic, partition)] += 1
            txn.acked[value] = entry.offset
        return txn

    def _decide(self, txn: Txn, visible: bool, hidden: frozenset[int] = frozenset()) -> Txn:
        """Ask for the decision and apply it; ``hidden``: where the marker never came."""
        txn.commit_at = self.tick()
        for topic, partition, value in txn.writes:
            if partition not in hidden:
                self.entries[value].visible = visible
                self.ends[(topic, partition)] += 1
        txn.end = self.tick()
        self.txns.append(txn)
        return txn

    def produce(
        self,
        partitions: list[int],
        intent: Intent = Intent.COMMIT,
        outcome: Outcome = Outcome.OK,
        *,
        committed: bool | None = None,
        hidden: frozenset[int] = frozenset(),
    ) -> Txn:
        """A producer transaction; ``committed`` settles one in doubt (``info``)."""
        writes = [(DATA_TOPIC, p, f"{{txn}}.{i}") for i, p in enumerate(partitions)]
        txn = self._begin("produce", intent, outcome, writes)
        if outcome is Outcome.FAIL:  # failed before its commit was asked for
            txn.end = self.tick()
            self.txns.append(txn)
            return txn
        visible = intent is Intent.COMMIT and outcome in (Outcome.OK, Outcome.INFO)
        return self._decide(txn, visible if committed is None else committed, hidden)

    def copy(self, partition: int, intent: Intent = Intent.COMMIT, start: int = -1) -> Txn | None:
        """A copier transaction over the input not yet copied (or from ``start``)."""
        key = tp(DATA_TOPIC, partition)
        since = self.committed.get(key, 0) if start < 0 else start
        log = self.logs[(DATA_TOPIC, partition)]
        inputs = [e for e in log[bisect_left(log, since, key=lambda e: e.offset) :] if e.visible]
        if not inputs:
            return None
        writes = [(COPY_TOPIC, partition, copy_value("{txn}", e.value)) for e in inputs]
        aborted = intent is Intent.ABORT
        txn = self._begin("copy", intent, Outcome.ABORTED if aborted else Outcome.OK, writes)
        txn.reads = [(DATA_TOPIC, partition, e.offset, e.value) for e in inputs]
        txn.offsets = {key: inputs[-1].offset + 1}
        if not aborted:
            self.committed[key] = inputs[-1].offset + 1
        return self._decide(txn, not aborted)

    def poll(self, reader: str) -> Poll | None:
        """What ``reader`` gets past its positions (visible records only)."""
        positions = self.positions.setdefault(reader, dict.fromkeys(PARTS, 0))
        start = self.tick(0.001)
        records = []
        for part in PARTS:
            log = self.logs[part]
            for entry in log[bisect_left(log, positions[part], key=lambda e: e.offset) :]:
                if entry.visible:
                    records.append((*part, entry.offset, entry.value))
                    positions[part] = entry.offset + 1
        if not records:
            return None
        self.polls.append(Poll(reader, start, self.tick(0.001), records))
        return self.polls[-1]

    def lose(self, txn: Txn) -> None:
        """A new leader never had ``txn``'s records (the last ones): their offsets are reused."""
        for topic, partition, value in txn.writes:
            self.ends[(topic, partition)] = self.entries[value].offset
            self.logs[(topic, partition)].pop()

    def fault(self, kind: str, length: float) -> None:
        self.faults.append(Fault(kind, self.tick(), self.tick(length), f"{kind} of the model"))

    def final(self) -> Final:
        records = [(*p, e.offset, e.value) for p in PARTS for e in self.logs[p] if e.visible]
        ends = {tp(*p): n for p, n in self.ends.items()}
        return Final("final", self.tick(), records, dict(self.committed), ends)

    def events(self, final: bool = True) -> list[Event]:
        return [*self.txns, *self.polls, *self.faults, *([self.final()] if final else [])]


def busy_run(txns: int = 40, seed_faults: bool = True) -> Run:
    """Every outcome, both kinds of transaction, two readers and a few faults."""
    run = Run()
    for i in range(txns):
        parts = sorted({i % PARTITIONS, (i + 1) % PARTITIONS, (i + 2 * (i % 3)) % PARTITIONS})
        if i % 5 == 4:
            run.produce(parts, Intent.ABORT, Outcome.ABORTED)
        elif i % 11 == 7:
            run.produce(parts, Intent.COMMIT, Outcome.INFO)  # in doubt, committed
        elif i % 13 == 8:
            run.produce(parts, Intent.COMMIT, Outcome.FAIL)
        elif i % 17 == 9:
            run.produce(parts, Intent.COMMIT, Outcome.ABORTED)  # aborted after an error
        else:
            run.produce(parts)
        if i % 2:
            run.poll("r1")
        if i % 7 == 6:
            run.poll("r2")
        if i % 6 == 5:
            for partition in range(PARTITIONS):
                run.copy(partition, Intent.ABORT if (i + partition) % 4 == 0 else Intent.COMMIT)
        if seed_faults and i % 15 == 3:
            run.fault("kill" if i % 2 else "partition-host", 0.05)
    run.produce([0, 1], Intent.COMMIT, Outcome.INFO, committed=False)  # in doubt
    run.produce([2, 3])  # left uncopied: the committed offsets stop short of the end
    run.poll("r1")
    run.poll("r2")
    return run


def kinds(report: Report) -> set[str]:
    return {a.kind for a in report.anomalies}


def of(report: Report, kind: str) -> list[checker.Anomaly]:
    return [a for a in report.anomalies if a.kind == kind]


def final_of(events: list[Event]) -> Final:
    return next(e for e in events if isinstance(e, Final))


def middle_ok_txn(run: Run) -> Txn:
    """An ok producer transaction from the middle of the run."""
    return [t for t in run.txns if t.kind == "produce" and t.outcome is Outcome.OK][20]


def drop(events: list[Event], values: set[str], reader: str | None = None) -> None:
    """Take ``values`` out of the final read, or out of every poll of ``reader``."""
    targets: list[Poll | Final] = [final_of(events)]
    if reader is not None:
        targets = [e for e in events if isinstance(e, Poll) and e.process == reader]
    for e in targets:
        e.records = [r for r in e.records if r[3] not in values]


def test_a_clean_history_checks_clean() -> None:
    run = busy_run()
    report = check(run.events())
    assert report.ok, report.summary()
    assert set(report.outcomes) == {"ok", "aborted", "fail", "info"}
    assert report.polls > 10 and report.final_records > 50
    assert report.values_read >= report.final_records
    assert any(t.kind == "copy" and t.outcome is Outcome.OK for t in run.txns)


def test_the_history_survives_its_json_lines() -> None:
    assert check([decode(encode(e)) for e in busy_run().events()]).ok


# -- every kind, planted --------------------------------------------------------------


def test_lost_an_acknowledged_write_missing_from_the_final_read() -> None:
    run = busy_run()
    txn = middle_ok_txn(run)
    events = run.events()
    drop(events, {txn.writes[0][2]})
    report = check(events)
    assert [a.txns for a in of(report, checker.LOST)] == [(txn.txn,)], report.summary()
    assert kinds(report) == {checker.LOST, checker.PARTIAL}  # ok, so it was visible whole


def test_bug_ack_before_isr_loses_an_ok_transaction_at_a_leader_change() -> None:
    """A leader acknowledged writes its followers never had; the new leader's log ends
    before them and the next transactions take their offsets."""
    run = busy_run()
    lost = run.produce([1, 2])
    run.lose(lost)
    run.fault("leader-cut", 0.5)
    after = run.produce([1, 2])
    assert list(after.acked.values()) == list(lost.acked.values())  # the same offsets
    run.poll("r1")
    report = check(run.events())
    assert kinds(report) == {checker.LOST}, report.summary()
    assert of(report, checker.LOST)[0].txns == (lost.txn,)


def test_offset_two_values_when_a_reader_saw_what_a_leader_change_took_away() -> None:
    run = busy_run()
    lost = run.produce([1, 2])
    run.poll("r2")  # r2 reads the doomed records from the old leader
    run.lose(lost)
    after = run.produce([1, 2])
    run.produce([1, 2])
    run.poll("r2")
    report = check(run.events())
    diverged = of(report, checker.OFFSET_TWO_VALUES)
    pair = tuple(sorted((after.txn, lost.txn)))
    assert len(diverged) == 2 and {a.txns for a in diverged} == {pair}
    assert kinds(report) == {checker.OFFSET_TWO_VALUES, checker.LOST}


def test_duplicate_an_input_copied_twice() -> None:
    run = busy_run()
    before = {t.txn for t in run.txns}
    again = run.copy(0, start=0)  # a copier that lost its place copies partition 0 again
    assert again is not None
    report = check(run.events())
    assert kinds(report) == {checker.DUPLICATE}, report.summary()
    duplicates = of(report, checker.DUPLICATE)
    assert 0 < len(duplicates) <= len(again.writes)  # its last inputs had not been copied
    assert all(again.txn in a.txns and len(set(a.txns) & before) == 1 for a in duplicates)


@pytest.mark.parametrize("where", ["poll", "final"])
def test_value_two_offsets(where: str) -> None:
    run = busy_run()
    txn = next(t for t in run.txns if t.kind == "copy" and t.outcome is Outcome.OK)
    topic, partition, value = txn.writes[0]
    events = run.events()
    if where == "poll":  # another reader got the value at a place it never was
        events.append(Poll("r9", 100.0, 100.1, [(topic, partition, 10_000, value)]))
    else:  # a write applied twice
        final = final_of(events)
        final.records.append((topic, partition, run.ends[(topic, partition)] + 3, value))
    report = check(events)
    assert of(report, checker.VALUE_TWO_OFFSETS)[0].txns == (txn.txn,), report.summary()
    # applied again at the end of the log, long after its acknowledgement: out of order too
    other = {checker.CYCLE} if where == "final" else set()
    assert kinds(report) == {checker.VALUE_TWO_OFFSETS} | other


@pytest.mark.parametrize("how", ["abort/aborted", "commit/aborted", "abort/info", "commit/fail"])
def test_aborted_read(how: str) -> None:
    run = busy_run()
    intent, outcome = how.split("/")
    txn = run.produce([0, 3], Intent(intent), Outcome(outcome))
    topic, partition, value = txn.writes[1]
    events = run.events()
    when = run.tick(1.0)
    events.append(Poll("r9", when, when, [(topic, partition, txn.acked[value], value)]))
    report = check(events)
    assert [a.txns for a in of(report, checker.ABORTED_READ)] == [(txn.txn,)], report.summary()
    # a failed one never asked to commit: seeing it is also seeing undecided data
    undecided = {checker.UNDECIDED_READ} if txn.commit_at is None else set()
    assert kinds(report) == {checker.ABORTED_READ} | undecided


def test_undecided_read_before_the_commit_was_asked_for() -> None:
    run = busy_run()
    txn = middle_ok_txn(run)
    topic, partition, value = txn.writes[0]
    assert txn.commit_at is not None
    events = run.events()
    early = txn.commit_at - 0.001
    events.append(Poll("r9", txn.start, early, [(topic, partition, txn.acked[value], value)]))
    report = check(events)
    assert kinds(report) == {checker.UNDECIDED_READ}, report.summary()
    assert of(report, checker.UNDECIDED_READ)[0].txns == (txn.txn,)


def test_bug_hw_reader_sees_aborted_and_undecided_records() -> None:
    """A reader bound by the high watermark instead of the last stable offset: it gets an
    aborted transaction's records and a committed one's before its commit was asked."""
    run = busy_run()
    events = run.events()
    aborted = run.produce([1, 2], Intent.ABORT, Outcome.ABORTED)
    committed = run.produce([1, 2])
    assert committed.commit_at is not None
    seen = [(DATA_TOPIC, p, t.acked[v], v) for t in (aborted, committed) for _, p, v in t.writes]
    events += [aborted, committed, Poll("r9", committed.start, committed.commit_at - 0.001, seen)]
    report = check(events)
    assert {a.txns for a in of(report, checker.ABORTED_READ)} == {(aborted.txn,)}
    # the abort had been asked for when it polled, the commit not yet
    assert {a.txns for a in of(report, checker.UNDECIDED_READ)} == {(committed.txn,)}


def test_non_monotonic_offsets_of_one_reader() -> None:
    run = busy_run()
    events = run.events()
    polls = [e for e in events if isinstance(e, Poll) and e.process == "r1"]
    polls[3].records += polls[1].records[:1]  # an old record again
    report = check(events)
    assert kinds(report) == {checker.NON_MONOTONIC}, report.summary()
    assert all("r1" in a.detail for a in report.anomalies)


def test_partial_in_the_final_read() -> None:
    run = busy_run()
    visible = {r[3] for r in run.final().records}
    txn = next(t for t in run.txns if t.outcome is Outcome.INFO and t.writes[0][2] in visible)
    events = run.events()
    drop(events, {txn.writes[-1][2]})
    report = check(events)
    assert kinds(report) == {checker.PARTIAL}, report.summary()  # info: not lost
    assert of(report, checker.PARTIAL)[0].txns == (txn.txn,)


def test_partial_to_one_reader() -> None:
    run = busy_run()
    txn = middle_ok_txn(run)
    events = run.events()
    drop(events, {txn.writes[-1][2]}, "r1")
    report = check(events)
    assert kinds(report) == {checker.PARTIAL}, report.summary()
    (anomaly,) = of(report, checker.PARTIAL)
    assert anomaly.txns == (txn.txn,) and "reader r1" in anomaly.detail


def test_skipped_by_one_reader() -> None:
    run = busy_run()
    txn = middle_ok_txn(run)
    events = run.events()
    drop(events, {value for _, _, value in txn.writes}, "r1")
    report = check(events)
    assert kinds(report) == {checker.SKIPPED}, report.summary()
    assert {a.txns for a in report.anomalies} == {(txn.txn,)}


def test_bug_one_marker_leaves_a_transaction_partly_visible() -> None:
    """The commit marker reached one of the transaction's partitions only."""
    run = busy_run()
    txn = run.produce([1, 2], hidden=frozenset({2}))
    run.produce([1, 2])
    run.poll("r1")
    report = check(run.events())
    assert {checker.PARTIAL, checker.LOST} <= kinds(report), report.summary()
    assert {a.txns for a in of(report, checker.LOST)} == {(txn.txn,)}
    partial = of(report, checker.PARTIAL)
    assert {a.txns for a in partial} == {(txn.txn,)}
    assert any("final read" in a.detail for a in partial)
    assert any("reader r1" in a.detail for a in partial)  # r1 read past the hidden one


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("past-uncopied", "which has no visible copy"),
        ("past-end", "past its end"),
        ("behind-copied", "has a visible copy but"),
        ("not-one-past", "its last input there was"),
        ("never-stable", "never became stable"),
    ],
)
def test_committed_offset(how: str, says: str) -> None:
    run = busy_run()
    events = run.events()
    final = final_of(events)
    key = tp(DATA_TOPIC, 2)
    copier = next(t for t in run.txns if t.kind == "copy" and t.outcome is Outcome.OK)
    if how == "past-uncopied":
        final.committed_offsets[key] = final.end_offsets[key]
    elif how == "past-end":
        final.committed_offsets[key] = final.end_offsets[key] + 5
    elif how == "behind-copied":
        final.committed_offsets[key] = 1
    elif how == "never-stable":
        final.committed_offsets.clear()
        final.offsets_error = "EosTimeoutError: UNSTABLE_OFFSET_COMMIT until the deadline"
    else:
        (where,) = copier.offsets
        copier.offsets[where] += 3
    report = check(events)
    assert kinds(report) == {checker.COMMITTED_OFFSET}, report.summary()
    assert any(says in a.detail for a in report.anomalies), report.summary()
    if how == "past-uncopied":  # names the input's transaction: the last one, not copied
        assert any(run.txns[-1].txn in a.txns for a in report.anomalies)
    if how == "not-one-past":
        assert report.anomalies[0].txns == (copier.txn,)


def test_cycle_a_later_transaction_ordered_before_an_earlier_one() -> None:
    run = busy_run()
    events = run.events()
    # the first two transactions, both on partition 1, both ended before any poll
    first, later = run.txns[:2]
    assert first.end < later.start < later.end < min(p.start for p in run.polls)
    a = next(v for _, p, v in first.writes if p == 1)
    b = next(v for _, p, v in later.writes if p == 1)
    swap = {a: b, b: a}
    for event in events:  # every read of partition 1 agrees on the swapped order
        if isinstance(event, Poll | Final):
            event.records = [(t, p, o, swap.get(v, v)) for t, p, o, v in event.records]
        elif isinstance(event, Txn):
            event.reads = [(t, p, o, swap.get(v, v)) for t, p, o, v in event.reads]
    report = check(events)
    assert kinds(report) == {checker.CYCLE}, report.summary()
    assert {frozenset(a.txns) for a in report.anomalies} == {frozenset({first.txn, later.txn})}


def test_concurrent_transactions_may_meet_in_opposite_orders() -> None:
    """Sends append at once, so two open transactions interleave: p0 holds A then B, p1
    holds B then A. No anomaly: neither was acknowledged before the other began."""
    a = Txn("p1", "p1.1", "produce", Intent.COMMIT, 1.0, 3.0, Outcome.OK, commit_at=2.5)
    b = Txn("p2", "p2.1", "produce", Intent.COMMIT, 1.1, 3.1, Outcome.OK, commit_at=2.6)
    a.writes = [(DATA_TOPIC, 0, "p1.1.0"), (DATA_TOPIC, 1, "p1.1.1")]
    b.writes = [(DATA_TOPIC, 0, "p2.1.0"), (DATA_TOPIC, 1, "p2.1.1")]
    logs = {0: ["p1.1.0", "p2.1.0"], 1: ["p2.1.1", "p1.1.1"]}
    records = [(DATA_TOPIC, p, o, v) for p, log in logs.items() for o, v in enumerate(log)]
    events: list[Event] = [a, b, Final("final", 9.0, records)]
    assert check(events).ok, check(events).summary()


@pytest.mark.parametrize("how", ["garbage", "copy-of-nothing", "wrong-partition"])
def test_unknown_value(how: str) -> None:
    run = busy_run()
    events = run.events()
    if how == "garbage":
        events.append(Poll("r9", 100.0, 100.1, [(DATA_TOPIC, 1, 10_000, "\x00garbage")]))
    elif how == "copy-of-nothing":
        txn = Txn("c1", "c1.999", "copy", Intent.COMMIT, 99.0, 99.5, Outcome.OK, commit_at=99.4)
        value = copy_value(txn.txn, "p1.999.0")
        txn.writes = [(COPY_TOPIC, 0, value)]
        events.append(txn)
        final_of(events).records.append((COPY_TOPIC, 0, run.ends[(COPY_TOPIC, 0)], value))
    else:
        txn = middle_ok_txn(run)
        _, partition, value = txn.writes[0]
        wrong = (partition + 1) % PARTITIONS
        events.append(Poll("r9", 100.0, 100.1, [(DATA_TOPIC, wrong, 10_000, value)]))
    report = check(events)
    assert checker.UNKNOWN_VALUE in kinds(report), report.summary()
    if how != "wrong-partition":
        assert kinds(report) == {checker.UNKNOWN_VALUE}
    else:  # it was also read where it really is
        assert kinds(report) == {checker.UNKNOWN_VALUE, checker.VALUE_TWO_OFFSETS}


def test_no_final_read_is_no_verdict() -> None:
    report = check(busy_run().events(final=False))
    assert kinds(report) == {checker.NO_FINAL} and not report.ok


def test_every_kind_has_a_test() -> None:
    names = " ".join(name for name in globals() if name.startswith("test_"))
    assert all(k.replace("-", "_") in names for k in checker.KINDS if k != checker.NO_FINAL)


# -- the report folder ----------------------------------------------------------------


def test_write_report_makes_the_three_files(tmp_path: Path) -> None:
    run = busy_run()
    events = run.events()
    report = check(events)
    summary = write_report(tmp_path, events, report, seed=7, minutes=0.5, spec_text="kill x2")
    assert summary == tmp_path / "summary.md"
    text = summary.read_text()
    assert "PASS" in text and "Seed 7" in text and "kill x2" in text
    assert "| kill |" in text and "| partition-host |" in text
    svg = ET.parse(tmp_path / "timeline.svg").getroot()
    bands = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "fault"]
    assert len(bands) == len(run.faults) > 0
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}circle"))) > 20
    doc = json.loads((tmp_path / "anomalies.json").read_text())
    assert doc["ok"] is True and doc["anomalies"] == []


def test_write_report_lists_each_anomaly_with_its_transactions(tmp_path: Path) -> None:
    run = busy_run()
    txn = middle_ok_txn(run)
    events = run.events()
    drop(events, {txn.writes[0][2]})
    report = check(events)
    write_report(tmp_path, events, report, seed=1, minutes=1.0, spec_text="")
    doc = json.loads((tmp_path / "anomalies.json").read_text())
    assert {a["kind"] for a in doc["anomalies"]} == {checker.LOST, checker.PARTIAL}
    assert doc["transactions"][txn.txn]["writes"][0][2] == txn.writes[0][2]
    assert "FAIL: 2 anomalies" in (tmp_path / "summary.md").read_text()


def test_a_long_history_checks_in_one_pass() -> None:
    """Some 100,000 values written and twice that read: the rules must not compare records
    pairwise (no timing is asserted: the machine may be loaded)."""
    run = busy_run(txns=25_000, seed_faults=False)
    events = run.events()
    report = check(events)
    assert report.ok, report.summary()
    assert report.values_written > 40_000 and report.records_polled > 40_000
