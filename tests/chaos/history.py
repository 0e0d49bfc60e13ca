"""What the chaos workload records, and how record values name their transaction.

Every process of the workload writes its own history as JSON lines, one event per line,
appended and flushed at once, so a SIGKILL loses at most the event being written and never
one that came before it. Times are ``time.monotonic()`` seconds: on Linux that clock
(CLOCK_MONOTONIC) is shared by every process of the machine, so a copier's "commit
requested" and the reader's "record seen" can be compared directly.

An output record's value names the copier transaction that wrote it, so the checker needs
nothing but the value to tell which transaction a record belongs to and whether that
transaction was meant to be aborted::

    <input partition>|<input offset>|<copier>|<instance>|<txn>|<A or C>|<input value>

``copier`` is the input partition the copier owns, ``instance`` counts its restarts (every
restart is a new process with the same transactional id), ``txn`` counts the instance's
transactions and ``A`` marks one the copier will abort on purpose.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

SEPARATOR = "|"


class TxnKey(NamedTuple):
    """One transaction of one copier instance."""

    copier: int
    instance: int
    txn: int


@dataclass(frozen=True)
class OutputValue:
    """The decoded value of an output record."""

    in_partition: int
    in_offset: int
    copier: int
    instance: int
    txn: int
    meant_abort: bool
    payload: str

    @property
    def key(self) -> TxnKey:
        return TxnKey(self.copier, self.instance, self.txn)

    @property
    def source(self) -> tuple[int, int]:
        """The input record it copies: (input partition, input offset)."""
        return self.in_partition, self.in_offset

    def encode(self) -> str:
        flag = "A" if self.meant_abort else "C"
        fields = (self.in_partition, self.in_offset, self.copier, self.instance, self.txn)
        return SEPARATOR.join([*(str(f) for f in fields), flag, self.payload])

    @classmethod
    def decode(cls, raw: str) -> OutputValue:
        """Raises ValueError for a value the workload cannot have written."""
        parts = raw.split(SEPARATOR, 6)
        if len(parts) != 7 or parts[5] not in ("A", "C"):
            raise ValueError(f"not a copier value: {raw[:80]!r}")
        p, o, c, i, t = (int(x) for x in parts[:5])
        return cls(p, o, c, i, t, parts[5] == "A", parts[6])


class HistoryWriter:
    """Appends events to a JSON-lines file, each flushed to the OS before ``write``
    returns, so a SIGKILL of the writer keeps every event it finished writing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields: Any) -> float:
        """Record ``event`` now; returns its time."""
        now = time.monotonic()
        line = json.dumps({"e": event, "t": now, **fields}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())
        return now

    def close(self) -> None:
        os.close(self._fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of one history file. A last line cut by a SIGKILL is left out: the event
    it was writing did not happen as far as the history is concerned."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class CopierHistory:
    """The events of one copier instance (one process)."""

    copier: int
    instance: int
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Read:
    """One record the read_committed reader was given, and when it had it."""

    t: float
    partition: int
    offset: int
    value: str


@dataclass
class History:
    """Everything the checker looks at, gathered after a run.

    ``inputs`` is the seeded input topic, partition -> values by offset; ``reads`` what
    the live reader saw in order; ``output`` the whole output topic read back at the end
    (partition -> [(offset, value)]); ``committed`` each copier group's final committed
    offset of its input partition (None if it has none).
    """

    inputs: dict[int, list[str]]
    copiers: list[CopierHistory]
    reads: list[Read]
    output: dict[int, list[tuple[int, str]]]
    committed: dict[int, int | None]

    @property
    def records(self) -> int:
        return sum(len(v) for v in self.inputs.values())


def reads_from_events(events: list[dict[str, Any]]) -> Iterator[Read]:
    """The reader's ``poll`` events, one Read per record."""
    for event in events:
        if event["e"] == "poll":
            for partition, offset, value in event["records"]:
                yield Read(event["t"], partition, offset, value)


def load_copiers(directory: Path) -> list[CopierHistory]:
    """Every ``copier-<p>-<instance>.jsonl`` of a run directory."""
    found = []
    for path in sorted(directory.glob("copier-*-*.jsonl")):
        _, copier, instance = path.stem.split("-")
        found.append(CopierHistory(int(copier), int(instance), read_events(path)))
    return found


def copier_history_path(directory: Path, copier: int, instance: int) -> Path:
    return directory / f"copier-{copier}-{instance}.jsonl"
