"""The checker of a Jepsen-style run: the recorded events in, the anomalies out.

Pure (no I/O, no clock), so ``test_checker.py`` can plant each anomaly into a clean history
and show that its rule fires: a rule that cannot fail proves nothing about a run. Every
rule is stated so that a correct system never trips it, whatever the faults and however
the processes interleave; each kind's constant says why.

Built for a long run (some 100,000 values, a million records read): every rule is one
pass over the reads with dicts and sets, and nothing compares records pairwise.

A transaction is *never committed* if it was aborted on purpose (``Intent.ABORT``), its
abort was acknowledged (``aborted``) or it failed before its commit was asked for
(``fail``). An ``ok`` one is committed; an ``info`` one may be either, but whole.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.jepsen.history import (
    DATA_TOPIC,
    Event,
    Fault,
    Final,
    Intent,
    Outcome,
    Poll,
    Record,
    Txn,
    copy_source,
    tp,
)

#: An ``ok`` transaction's value is missing from the final read: its commit was
#: acknowledged, so every one of its records must survive every fault.
LOST = "lost"
#: Two committed copies of one input value are in the final read: each copier transaction
#: commits its input offsets with its output, so a correct group never copies an input
#: twice into the visible log.
DUPLICATE = "duplicate"
#: One value read at two places (topic, partition, offset), anywhere: values are unique
#: and a record never moves, so either a write was applied twice or the log was rewritten.
VALUE_TWO_OFFSETS = "value-two-offsets"
#: Two reads (by any processes, polls or final) saw different values at one place: an
#: offset, once read, names one record forever, so replicas diverged.
OFFSET_TWO_VALUES = "offset-two-values"
#: A read_committed read returned a record of a transaction that was never committed.
ABORTED_READ = "aborted-read"
#: A read returned a record before its transaction's commit was even requested (or of one
#: whose commit never was): read_committed showed data nothing had decided yet. Times are
#: CLOCK_MONOTONIC of one machine, so they compare across processes.
UNDECIDED_READ = "undecided-read"
#: A reader, which never seeks back, got offsets of a partition out of strict increasing
#: order across its polls.
NON_MONOTONIC = "non-monotonic"
#: A transaction visible on some of its partitions and not others, in the final read or
#: to one reader: that reader saw it on one partition and read past its record on
#: another without getting it. A read_committed reader only passes an offset once the
#: transaction holding it is decided, and a decided transaction is visible everywhere.
PARTIAL = "partial"
#: A reader read past a record of the final log without getting it, and saw none of that
#: record's transaction anywhere else (the same argument as ``PARTIAL``).
SKIPPED = "skipped"
#: The copiers' committed offsets disagree with what they copied: past an input without a
#: visible copy, behind an input that has one, past the partition's end, or not one past
#: the last input the committing transaction read.
COMMITTED_OFFSET = "committed-offset"
#: The log order contradicts real time: a record of T2 precedes a record of T1 in a
#: partition although T1's record was acknowledged before T2 began. (Record order alone
#: across partitions is no anomaly here: sends append at once, so two concurrent
#: transactions may meet in opposite orders on two partitions; only the real-time edge
#: makes the pair a cycle.)
CYCLE = "cycle"
#: A value read that no transaction of the history wrote (or in a partition it was not
#: written to), or a copy of an input no ``DATA_TOPIC`` read ever held: corruption.
UNKNOWN_VALUE = "unknown-value"
#: The history holds no final read, so losses cannot be judged: the run proves nothing.
NO_FINAL = "no-final"

KINDS = (
    LOST,
    DUPLICATE,
    VALUE_TWO_OFFSETS,
    OFFSET_TWO_VALUES,
    ABORTED_READ,
    UNDECIDED_READ,
    NON_MONOTONIC,
    PARTIAL,
    SKIPPED,
    COMMITTED_OFFSET,
    CYCLE,
    UNKNOWN_VALUE,
    NO_FINAL,
)

Place = tuple[str, int, int]
Part = tuple[str, int]


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str
    txns: tuple[str, ...] = ()


@dataclass
class Report:
    """The anomalies and the numbers that say how much the run exercised."""

    anomalies: list[Anomaly] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)  # Outcome value -> txns
    txns: int = 0
    values_written: int = 0
    polls: int = 0
    records_polled: int = 0
    values_read: int = 0  # distinct values any read returned (polls, copiers, final)
    final_records: int = 0
    faults: int = 0

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def by_kind(self) -> dict[str, int]:
        counts = Counter(a.kind for a in self.anomalies)
        return {k: counts[k] for k in KINDS if counts[k]}

    def add(self, kind: str, detail: str, txns: tuple[str, ...] = ()) -> None:
        assert kind in KINDS, kind
        self.anomalies.append(Anomaly(kind, detail, txns))

    def summary(self, limit: int = 20) -> str:
        lines = [
            f"{self.txns} txns {self.outcomes}, {self.values_written} values written, "
            f"{self.values_read} read, {self.final_records} in the final read; "
            f"anomalies: {self.by_kind() or 'none'}"
        ]
        lines += [f"  {a.kind}: {a.detail} {list(a.txns)}" for a in self.anomalies[:limit]]
        return "\n".join(lines)


def never_committed(txn: Txn) -> bool:
    return txn.intent is Intent.ABORT or txn.outcome in (Outcome.ABORTED, Outcome.FAIL)


def check(events: list[Event]) -> Report:
    """Every anomaly of a run's ``events`` (none: the run upheld every guarantee)."""
    return _Checker(events).run()


@dataclass
class _Hits:
    """Reads of one transaction that broke one rule: counted, one kept as the example."""

    count: int = 0
    example: str = ""


class _Checker:
    def __init__(self, events: list[Event]) -> None:
        self.report = Report()
        self.txns: dict[str, Txn] = {}
        self.writer: dict[str, tuple[str, str, int]] = {}  # value -> (txn, topic, partition)
        self.polls: dict[str, list[Poll]] = defaultdict(list)
        finals: list[Final] = []
        for event in events:
            if isinstance(event, Txn):
                self.txns[event.txn] = event
                for topic, partition, value in event.writes:
                    self.writer[value] = (event.txn, topic, partition)
            elif isinstance(event, Poll):
                self.polls[event.process].append(event)
            elif isinstance(event, Final):
                finals.append(event)
            elif isinstance(event, Fault):
                self.report.faults += 1
        for polls in self.polls.values():
            polls.sort(key=lambda poll: poll.start)  # stable: equal starts keep file order
        self.final = max(finals, key=lambda f: f.at) if finals else None
        self.place_value: dict[Place, str] = {}
        self.value_place: dict[str, Place] = {}

    def run(self) -> Report:
        r = self.report
        r.txns = len(self.txns)
        r.outcomes = dict(Counter(str(t.outcome) for t in self.txns.values()))
        r.values_written = len(self.writer)
        r.polls = sum(len(p) for p in self.polls.values())
        r.records_polled = sum(len(p.records) for ps in self.polls.values() for p in ps)
        self._reads()
        self._monotonic()
        if self.final is None:
            r.add(NO_FINAL, "no final read: losses and partial transactions not judged")
        else:
            r.final_records = len(self.final.records)
            self._final(self.final)
            self._committed_offsets(self.final)
            self._real_time_order(self.final)
        self._readers()
        r.values_read = len(self.value_place)
        return r

    def _sources(self) -> list[tuple[str, float | None, list[Record]]]:
        """Every read with who made it and when its records were in hand at the latest: a
        poll's end; a copier transaction's start (it polled its input before beginning);
        none for the final read (everything was decided by then)."""
        sources: list[tuple[str, float | None, list[Record]]] = []
        if self.final is not None:
            sources.append((f"final {self.final.process}", None, self.final.records))
        for process, polls in self.polls.items():
            sources += [(f"poll of {process}@{p.end:.3f}", p.end, p.records) for p in polls]
        for txn in self.txns.values():
            if txn.reads:
                sources.append((f"copier txn {txn.txn}@{txn.start:.3f}", txn.start, txn.reads))
        return sources

    def _reads(self) -> None:
        """One pass over every record read: places, writers and visibility."""
        r, txns, writer = self.report, self.txns, self.writer
        place_value, value_place = self.place_value, self.value_place
        diverged: dict[Place, set[str]] = {}
        moved: dict[str, set[Place]] = {}
        unknown: dict[str, str] = {}
        aborted: dict[str, _Hits] = defaultdict(_Hits)
        undecided: dict[str, _Hits] = defaultdict(_Hits)
        data_values: set[str] = set()
        for who, at, records in self._sources():
            for topic, partition, offset, value in records:
                place = (topic, partition, offset)
                held = place_value.setdefault(place, value)
                if held != value:
                    diverged.setdefault(place, {held}).add(value)
                first = value_place.setdefault(value, place)
                if first != place:
                    moved.setdefault(value, {first}).add(place)
                if topic == DATA_TOPIC:
                    data_values.add(value)
                wrote = writer.get(value)
                if wrote is None:
                    unknown.setdefault(value, f"{value!r} at {place} ({who}): nobody wrote it")
                    continue
                name, w_topic, w_partition = wrote
                if (w_topic, w_partition) != (topic, partition):
                    unknown.setdefault(
                        value,
                        f"{value!r} at {place} ({who}) was written to {tp(w_topic, w_partition)}",
                    )
                txn = txns[name]
                if never_committed(txn):
                    hits = aborted[name]
                    hits.count += 1
                    hits.example = hits.example or f"{value!r} at {place} ({who})"
                if at is not None and (txn.commit_at is None or at < txn.commit_at):
                    hits = undecided[name]
                    hits.count += 1
                    if not hits.example:
                        asked = "never" if txn.commit_at is None else f"at {txn.commit_at:.3f}"
                        hits.example = f"{value!r} at {place} ({who}); commit asked {asked}"
        for value in value_place:
            source = copy_source(value)
            if source is not None and source[1] not in data_values:
                unknown.setdefault(value, f"{value!r} copies a value no {DATA_TOPIC} read held")
        for place, values in diverged.items():
            names = _names(writer, values)
            r.add(OFFSET_TWO_VALUES, f"{place} read as {sorted(values)}", names)
        for value, places in moved.items():
            r.add(VALUE_TWO_OFFSETS, f"{value!r} read at {sorted(places)}", _names(writer, [value]))
        for value, detail in unknown.items():
            r.add(UNKNOWN_VALUE, detail, _names(writer, [value]))
        for name, hits in aborted.items():
            txn = txns[name]
            why = f"intent {txn.intent}, outcome {txn.outcome}"
            r.add(
                ABORTED_READ,
                f"{hits.count} reads of txn {name} ({why}), e.g. {hits.example}",
                (name,),
            )
        for name, hits in undecided.items():
            r.add(
                UNDECIDED_READ,
                f"{hits.count} early reads of txn {name}, e.g. {hits.example}",
                (name,),
            )

    def _monotonic(self) -> None:
        for process, polls in self.polls.items():
            last: dict[Part, int] = {}
            bad: dict[Part, _Hits] = defaultdict(_Hits)
            for poll in polls:
                for topic, partition, offset, _ in poll.records:
                    part = (topic, partition)
                    before = last.get(part)
                    if before is not None and offset <= before:
                        hits = bad[part]
                        hits.count += 1
                        hits.example = hits.example or f"{offset} after {before} @{poll.end:.3f}"
                    last[part] = offset if before is None else max(before, offset)
            for part, hits in bad.items():
                self.report.add(
                    NON_MONOTONIC,
                    f"reader {process}, {tp(*part)}: {hits.count} offsets not increasing, "
                    f"e.g. {hits.example}",
                )

    def _final(self, final: Final) -> None:
        """Losses, partial transactions and duplicated copies, judged on the final read."""
        r, writer = self.report, self.writer
        visible: dict[str, set[str]] = defaultdict(set)
        copies: dict[str, list[str]] = defaultdict(list)  # input value -> visible copies
        for _, _, _, value in final.records:
            wrote = writer.get(value)
            if wrote is not None:
                visible[wrote[0]].add(value)
            source = copy_source(value)
            if source is not None:
                copies[source[1]].append(value)
        for name, txn in self.txns.items():
            wanted = [value for _, _, value in txn.writes]
            seen = visible.get(name, set())
            missing = [value for value in wanted if value not in seen]
            if txn.outcome is Outcome.OK and missing:
                r.add(
                    LOST,
                    f"ok txn {name}: {len(missing)} of {len(wanted)} values missing "
                    f"from the final read, e.g. {missing[:3]}",
                    (name,),
                )
            if seen and missing and not never_committed(txn):
                r.add(
                    PARTIAL,
                    f"txn {name} ({txn.outcome}) visible in the final read on "
                    f"{len(seen)} of {len(wanted)} writes; missing {missing[:3]}",
                    (name,),
                )
        for input_value, values in copies.items():
            if len(set(values)) > 1:
                names = _names(writer, values)
                r.add(DUPLICATE, f"input {input_value!r} copied {len(set(values))} times", names)

    def _committed_offsets(self, final: Final) -> None:
        """The group's committed offsets against the final read and the copy transactions
        visible in it."""
        r, writer = self.report, self.writer
        if final.offsets_error is not None:
            r.add(COMMITTED_OFFSET, "the group's committed offsets never became stable "
                  f"(a transaction's offsets left pending): {final.offsets_error}", ())  # fmt: skip
        copied: set[str] = set()  # input values with a visible copy
        visible_copies: set[str] = set()
        for _, _, _, value in final.records:
            source = copy_source(value)
            if source is not None:
                copied.add(source[1])
                wrote = writer.get(value)
                if wrote is not None:
                    visible_copies.add(wrote[0])
        # per input partition: (committed offset, txn) of visible copies, to name the culprit
        commits: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for name in sorted(visible_copies):
            txn = self.txns[name]
            last: dict[str, int] = {}
            for topic, partition, offset, _ in txn.reads:
                key = tp(topic, partition)
                last[key] = max(last.get(key, -1), offset)
            for key, committed in txn.offsets.items():
                commits[key].append((committed, name))
                if key not in last:
                    r.add(
                        COMMITTED_OFFSET,
                        f"visible copy txn {name} committed {key}="
                        f"{committed} but read nothing there",
                        (name,),
                    )
                elif committed != last[key] + 1:
                    r.add(
                        COMMITTED_OFFSET,
                        f"visible copy txn {name} committed {key}="
                        f"{committed}, its last input there was {last[key]}",
                        (name,),
                    )
        for ends in commits.values():
            ends.sort()
        for topic, partition, offset, value in final.records:
            if topic != DATA_TOPIC:
                continue
            key = tp(topic, partition)
            at_offset = final.committed_offsets.get(key)
            has_copy = value in copied
            if at_offset is not None and offset < at_offset and not has_copy:
                ends = commits.get(key, [])
                at = bisect_right(ends, (offset, "\uffff"))
                names = _names(writer, [value]) + ((ends[at][1],) if at < len(ends) else ())
                r.add(
                    COMMITTED_OFFSET,
                    f"{key} committed at {at_offset} past input "
                    f"{value!r}@{offset}, which has no visible copy",
                    names,
                )
            elif has_copy and (at_offset is None or offset >= at_offset):
                r.add(
                    COMMITTED_OFFSET,
                    f"input {value!r}@{offset} has a visible copy but "
                    f"{key} is committed at {at_offset}",
                    _names(writer, [value]),
                )
        for key, committed in final.committed_offsets.items():
            end = final.end_offsets.get(key)
            if end is not None and committed > end:
                r.add(COMMITTED_OFFSET, f"{key} committed at {committed}, past its end {end}")

    def _real_time_order(self, final: Final) -> None:
        """Per partition, each record's append time lies in its transaction's window: after
        its begin, and (if the transaction was acknowledged, or the send returned the
        record's offset) before its end. Walking a partition in offset order with the
        latest begin so far finds every record that must precede one appended earlier."""
        by_part: dict[Part, list[tuple[int, str]]] = defaultdict(list)
        for topic, partition, offset, value in final.records:
            by_part[(topic, partition)].append((offset, value))
        pairs: dict[tuple[str, str], str] = {}
        for part, records in by_part.items():
            records.sort()
            latest = float("-inf")
            latest_name = ""
            for offset, value in records:
                wrote = self.writer.get(value)
                if wrote is None:
                    continue
                txn = self.txns[wrote[0]]
                bounded = txn.outcome is Outcome.OK or value in txn.acked
                if bounded and txn.end < latest and (wrote[0], latest_name) not in pairs:
                    pairs[(wrote[0], latest_name)] = (
                        f"{tp(*part)}: {latest_name} (began {latest:.3f}) precedes "
                        f"{value!r}@{offset} of {wrote[0]}, acknowledged at {txn.end:.3f}"
                    )
                if txn.start > latest:
                    latest, latest_name = txn.start, wrote[0]
        for names, detail in pairs.items():
            self.report.add(CYCLE, detail, names)

    def _readers(self) -> None:
        """Per reader: records it read past without getting them (``PARTIAL`` if it saw
        their transaction elsewhere, ``SKIPPED`` if not). Where a record is comes from the
        final read, else from any other read, else from the offset its send returned (a
        record no read holds, such as one whose marker never came); only places strictly
        between a reader's first and last offset of a partition count as read past."""
        known: dict[Part, dict[int, str]] = defaultdict(dict)
        final_places: set[Place] = set()
        if self.final is not None:
            for topic, partition, offset, value in self.final.records:
                known[(topic, partition)].setdefault(offset, value)
                final_places.add((topic, partition, offset))
        for polls in self.polls.values():
            for poll in polls:
                for topic, partition, offset, value in poll.records:
                    known[(topic, partition)].setdefault(offset, value)
        for txn in self.txns.values():
            if never_committed(txn):
                continue
            for value, offset in txn.acked.items():
                wrote = self.writer.get(value)
                if wrote is not None:
                    known[(wrote[1], wrote[2])].setdefault(offset, value)
        ordered = {part: sorted(offsets) for part, offsets in known.items()}
        for process, polls in self.polls.items():
            got: dict[Part, set[int]] = defaultdict(set)
            seen: set[str] = set()
            for poll in polls:
                for topic, partition, offset, value in poll.records:
                    got[(topic, partition)].add(offset)
                    wrote = self.writer.get(value)
                    if wrote is not None:
                        seen.add(wrote[0])
            missed: dict[tuple[str, str], list[Place]] = defaultdict(list)
            for part, offsets in got.items():
                line = ordered.get(part, [])
                lo = bisect_right(line, min(offsets))
                hi = bisect_left(line, max(offsets))
                for offset in line[lo:hi]:
                    if offset in offsets:
                        continue
                    wrote = self.writer.get(known[part][offset])
                    if wrote is None or never_committed(self.txns[wrote[0]]):
                        continue
                    if wrote[0] in seen:
                        missed[(PARTIAL, wrote[0])].append((*part, offset))
                    elif (*part, offset) in final_places:
                        missed[(SKIPPED, wrote[0])].append((*part, offset))
            for (kind, name), places in missed.items():
                how = "saw it elsewhere but" if kind == PARTIAL else "saw none of it and"
                self.report.add(
                    kind,
                    f"reader {process} {how} read past {places[:3]} of "
                    f"txn {name} without getting it",
                    (name,),
                )


def _names(writer: dict[str, tuple[str, str, int]], values: Iterable[str]) -> tuple[str, ...]:
    """The transactions that wrote ``values``, sorted, once each."""
    return tuple(sorted({writer[v][0] for v in values if v in writer}))
