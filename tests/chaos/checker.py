"""The exactly-once checker: a recorded history in, a list of anomalies out.

Pure: no I/O, no clock, so every rule can be shown to fire on a history with the anomaly
planted in it (``test_checker.py``). The rules, and why each is sound:

* A transaction is **committed** once its copier recorded ``commit_ok`` (the coordinator
  acknowledged the decision), **in doubt** if the copier recorded ``commit_start`` but no
  answer (it was killed, fenced or timed out while the request was out: the decision may
  have been taken or not), and **not committed** otherwise: meant to be aborted, aborted
  after an error, or left open by a copier killed before it asked to commit. A record of a
  not-committed transaction seen by read_committed is an *aborted read*; so is a record
  whose value says "meant to abort", whatever the history says.
* A read is *premature* (an uncommitted read) if the reader had the record before its
  copier even started the commit request: the node cannot legitimately show a record
  before its marker, the marker follows the decision and the decision follows the request.
  Both times come from the machine-wide monotonic clock.
* Every input record must be in the output exactly once (*lost*, *duplicate*), a visible
  transaction must be visible whole and a committed one must be visible (*partial*), and
  each output partition carries its input partition's records in input order (*order*).
* The reader's offsets only go forward, and what it read is what the output holds at
  those offsets (*offset backwards*, *vanished*, *unread*).
* Committed group offsets match the output: the final one is the input's end and the end
  of the copied records; the position each copier instance started from is the end of a
  visible transaction, past every transaction acknowledged before it started, and never
  the end of one whose commit had not been requested yet (*committed offset*).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field

from tests.chaos.history import History, OutputValue, Read, TxnKey

DUPLICATE = "duplicate"
LOST = "lost"
ABORTED_READ = "aborted read"
UNCOMMITTED_READ = "uncommitted read"
OFFSET_BACKWARDS = "offset backwards"
ORDER = "order"
COMMITTED_OFFSET = "committed offset"
PARTIAL = "partial transaction"
CORRUPT = "corrupt"
VANISHED = "vanished"
UNREAD = "unread"

KINDS = (
    DUPLICATE,
    LOST,
    ABORTED_READ,
    UNCOMMITTED_READ,
    OFFSET_BACKWARDS,
    ORDER,
    COMMITTED_OFFSET,
    PARTIAL,
    CORRUPT,
    VANISHED,
    UNREAD,
)
HEADLINE = (DUPLICATE, LOST, ABORTED_READ)


class Status(enum.Enum):
    COMMITTED = "committed"
    IN_DOUBT = "in doubt"
    NOT_COMMITTED = "not committed"


@dataclass
class Txn:
    """A copier transaction as its history tells it."""

    key: TxnKey
    meant_abort: bool
    first: int
    last: int
    begin_t: float
    commit_start_t: float | None = None
    commit_ok_t: float | None = None

    @property
    def status(self) -> Status:
        if self.commit_ok_t is not None:
            return Status.COMMITTED
        if self.commit_start_t is not None:
            return Status.IN_DOUBT
        return Status.NOT_COMMITTED


@dataclass(frozen=True)
class Start:
    """Where a copier instance started: its group's committed offset, read at ``t``."""

    copier: int
    instance: int
    offset: int
    t: float


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str


@dataclass
class Report:
    records: int
    anomalies: list[Anomaly] = field(default_factory=list)
    statuses: dict[Status, int] = field(default_factory=dict)

    def add(self, kind: str, detail: str) -> None:
        assert kind in KINDS, kind
        self.anomalies.append(Anomaly(kind, detail))

    def count(self, kind: str) -> int:
        return sum(1 for a in self.anomalies if a.kind == kind)

    @property
    def other(self) -> int:
        return sum(1 for a in self.anomalies if a.kind not in HEADLINE)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def summary(self, limit: int = 20) -> str:
        counts = {k: self.count(k) for k in KINDS if self.count(k)}
        lines = [f"{self.records} records; anomalies: {counts or 'none'}"]
        lines += [f"  {a.kind}: {a.detail}" for a in self.anomalies[:limit]]
        return "\n".join(lines)


def collect(history: History) -> tuple[dict[TxnKey, Txn], list[Start]]:
    """The transactions and the start positions the copiers recorded."""
    txns: dict[TxnKey, Txn] = {}
    starts: list[Start] = []
    for copier in history.copiers:
        for event in copier.events:
            kind = event["e"]
            if kind == "position":
                starts.append(Start(copier.copier, copier.instance, event["offset"], event["t"]))
                continue
            if "txn" not in event or event["txn"] is None:
                continue
            key = TxnKey(copier.copier, copier.instance, event["txn"])
            if kind == "begin":
                txns[key] = Txn(key, event["abort"], event["first"], event["last"], event["t"])
            elif key in txns and kind == "commit_start":
                txns[key].commit_start_t = event["t"]
            elif key in txns and kind == "commit_ok":
                txns[key].commit_ok_t = event["t"]
    return txns, starts


def _decode(raw: str, where: str, report: Report) -> OutputValue | None:
    try:
        return OutputValue.decode(raw)
    except ValueError as exc:
        report.add(CORRUPT, f"{where}: {exc}")
        return None


def check(history: History) -> Report:
    """Every anomaly of ``history`` (an empty list: exactly once held)."""
    report = Report(history.records)
    txns, starts = collect(history)
    for txn in txns.values():
        report.statuses[txn.status] = report.statuses.get(txn.status, 0) + 1
    output: dict[int, list[tuple[int, OutputValue]]] = {}
    for partition, records in sorted(history.output.items()):
        decoded = [(o, _decode(v, f"output {partition}@{o}", report)) for o, v in records]
        output[partition] = [(o, v) for o, v in decoded if v is not None]
    _check_visibility(history.reads, output, txns, report)
    _check_output(history, output, txns, report)
    _check_reads_match_output(history.reads, history.output, report)
    _check_committed_offsets(history, output, txns, starts, report)
    return report


def _check_visibility(
    reads: list[Read],
    output: dict[int, list[tuple[int, OutputValue]]],
    txns: dict[TxnKey, Txn],
    report: Report,
) -> None:
    """Aborted, premature and backwards reads, by the live reader and in the output."""
    aborted: set[tuple[int, int]] = set()
    last_offset: dict[int, int] = {}
    seen: list[tuple[int, int, OutputValue, float | None]] = [
        (p, o, v, None) for p, records in output.items() for o, v in records
    ]
    for read in reads:
        previous = last_offset.get(read.partition)
        if previous is not None and read.offset <= previous:
            report.add(
                OFFSET_BACKWARDS,
                f"partition {read.partition}: offset {read.offset} read after {previous}",
            )
        last_offset[read.partition] = max(read.offset, previous or -1)
        value = _decode(read.value, f"read {read.partition}@{read.offset}", report)
        if value is not None:
            seen.append((read.partition, read.offset, value, read.t))
    for partition, offset, value, t in seen:
        txn = txns.get(value.key)
        if value.meant_abort or txn is None or txn.status is Status.NOT_COMMITTED:
            if (partition, offset) not in aborted:
                aborted.add((partition, offset))
                why = "meant to abort" if value.meant_abort else "never committed"
                if txn is None:
                    why = "no such transaction in the history"
                report.add(ABORTED_READ, f"{partition}@{offset} of txn {tuple(value.key)}: {why}")
            continue
        if t is not None and txn.commit_start_t is not None and t < txn.commit_start_t:
            report.add(
                UNCOMMITTED_READ,
                f"{partition}@{offset} of txn {tuple(value.key)} read "
                f"{txn.commit_start_t - t:.3f}s before its commit was requested",
            )


def _check_output(
    history: History,
    output: dict[int, list[tuple[int, OutputValue]]],
    txns: dict[TxnKey, Txn],
    report: Report,
) -> None:
    """Duplicates, losses, order, whole transactions and the copied payloads."""
    where: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    by_txn: dict[TxnKey, set[int]] = defaultdict(set)
    for partition, records in output.items():
        previous: OutputValue | None = None
        for offset, value in records:
            where[value.source].append((partition, offset))
            by_txn[value.key].add(value.in_offset)
            if value.in_partition != partition or value.copier != partition:
                report.add(CORRUPT, f"{partition}@{offset} holds a record of {value.source}")
            inputs = history.inputs.get(value.in_partition, [])
            if not 0 <= value.in_offset < len(inputs):
                report.add(CORRUPT, f"{partition}@{offset} copies no input record")
            elif inputs[value.in_offset] != value.payload:
                report.add(CORRUPT, f"{partition}@{offset} is not a copy of {value.source}")
            if previous is not None and value.in_offset < previous.in_offset:
                report.add(
                    ORDER,
                    f"partition {partition}: input offset {value.in_offset} at {offset} "
                    f"after {previous.in_offset}",
                )
            previous = value
    for source, places in sorted(where.items()):
        for place in places[1:]:
            report.add(DUPLICATE, f"input {source} at {places[0]} and again at {place}")
    for partition, inputs in sorted(history.inputs.items()):
        for offset in range(len(inputs)):
            if (partition, offset) not in where:
                report.add(LOST, f"input {(partition, offset)} is not in the output")
    for key, txn in sorted(txns.items()):
        visible = by_txn.get(key, set())
        expected = set(range(txn.first, txn.last + 1))
        if txn.status is Status.COMMITTED and visible != expected:
            report.add(PARTIAL, f"committed txn {tuple(key)}: {len(visible)} of {len(expected)}")
        elif visible and visible != expected and not txn.meant_abort:
            report.add(PARTIAL, f"txn {tuple(key)}: {len(visible)} of {len(expected)} visible")


def _check_reads_match_output(
    reads: list[Read], output: dict[int, list[tuple[int, str]]], report: Report
) -> None:
    """What the reader saw is what the output holds, and it saw all of it."""
    stored = {(p, o): v for p, records in output.items() for o, v in records}
    read_at: set[tuple[int, int]] = set()
    for read in reads:
        place = (read.partition, read.offset)
        read_at.add(place)
        if stored.get(place) != read.value:
            report.add(
                VANISHED,
                f"{place} was read as {read.value[:60]!r}, output has "
                f"{(stored.get(place) or '')[:60]!r}",
            )
    for place in sorted(stored.keys() - read_at):
        report.add(UNREAD, f"{place} is in the output but the reader never got it")


def _check_committed_offsets(
    history: History,
    output: dict[int, list[tuple[int, OutputValue]]],
    txns: dict[TxnKey, Txn],
    starts: list[Start],
    report: Report,
) -> None:
    for partition, inputs in sorted(history.inputs.items()):
        committed = history.committed.get(partition)
        copied = [v.in_offset for v in (v for _, v in output.get(partition, []))]
        end_of_copy = max(copied) + 1 if copied else 0
        if committed != len(inputs) or (copied and committed != end_of_copy):
            report.add(
                COMMITTED_OFFSET,
                f"partition {partition}: committed {committed}, input ends at {len(inputs)}, "
                f"copied records end at {end_of_copy}",
            )
    visible_ends: dict[tuple[int, int], Txn] = {}
    for records in output.values():
        for _, value in records:
            txn = txns.get(value.key)
            if txn is not None and value.in_offset == txn.last:
                visible_ends[(txn.key.copier, txn.last + 1)] = txn
    for start in starts:
        ending = visible_ends.get((start.copier, start.offset))
        if start.offset != 0 and ending is None:
            report.add(
                COMMITTED_OFFSET,
                f"copier {start.copier}/{start.instance} started at {start.offset}, "
                "which no visible transaction ends at",
            )
        if ending is not None and (
            ending.commit_start_t is None or ending.commit_start_t > start.t
        ):
            report.add(
                COMMITTED_OFFSET,
                f"copier {start.copier}/{start.instance} started at {start.offset} before "
                f"txn {tuple(ending.key)} asked to commit it",
            )
        acked = [
            txn
            for txn in txns.values()
            if txn.key.copier == start.copier
            and txn.commit_ok_t is not None
            and txn.commit_ok_t < start.t
        ]
        behind = max(acked, key=lambda txn: txn.last, default=None)
        if behind is not None and behind.last >= start.offset:
            report.add(
                COMMITTED_OFFSET,
                f"copier {start.copier}/{start.instance} started at {start.offset} "
                f"although txn {tuple(behind.key)} committed up to {behind.last + 1}",
            )
