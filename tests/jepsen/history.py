"""What a Jepsen-style run records: the contract between its workloads, its nemesis, its
checker and its report.

Every process of the run (producers, copiers and readers, each in its own network
namespace, and the nemesis in the test's process) appends JSON lines to its own file,
flushed at once, so a SIGKILL loses at most the line being written. Times are
``time.monotonic()`` seconds: CLOCK_MONOTONIC is one clock for every process of the
machine whatever its network namespace (and libfaketime, which skews a coordinator's wall
clock, is never loaded into a workload), so a producer's "commit requested" and a reader's
"record seen" compare directly.

Values are unique strings that name their transaction, so a record read anywhere says which
transaction wrote it without a lookup: ``<process>.<txn>.<index>`` for a producer,
``copy:<copier txn>/<input value>`` for a copier's output (``copy_value``): an input copied
by an aborted transaction is copied again by a later one, and each copy still names its own
transaction. Exactly one committed copy of each input value may be visible.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The topic transactional producers write (several partitions per transaction).
DATA_TOPIC = "jepsen-data"
#: The topic copiers write: ``copy:<value>`` of each record of ``DATA_TOPIC``, in the same
#: partition, with the input offsets committed in the same transaction.
COPY_TOPIC = "jepsen-copy"
#: The copiers' consumer group.
COPY_GROUP = "jepsen-copiers"
COPY_PREFIX = "copy:"


class Outcome(enum.StrEnum):
    OK = "ok"  # the commit was acknowledged
    ABORTED = "aborted"  # the abort was acknowledged (meant, or after an error)
    FAIL = "fail"  # certainly not committed: failed before its commit was asked for
    INFO = "info"  # unknown: the commit was asked for and no answer came back


class Intent(enum.StrEnum):
    COMMIT = "commit"
    ABORT = "abort"  # aborted on purpose; none of its records may ever be read


#: A record as read: (topic, partition, offset, value).
Record = tuple[str, int, int, str]
#: A write as sent: (topic, partition, value).
Write = tuple[str, int, str]


@dataclass
class Txn:
    """One transaction of a producer (``kind="produce"``) or a copier (``"copy"``)."""

    process: str
    txn: str  # unique in the run
    kind: str
    intent: Intent
    start: float  # begin
    end: float  # the answer to the commit or abort (or the error)
    outcome: Outcome
    commit_at: float | None = None  # when the commit (or abort) request was sent
    writes: list[Write] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # value -> offset its send returned
    reads: list[Record] = field(default_factory=list)  # a copier's input records
    offsets: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> next offset
    error: str | None = None
    type: str = "txn"


@dataclass
class Poll:
    """One poll of a read_committed reader that returned records (or an error)."""

    process: str
    start: float
    end: float
    records: list[Record] = field(default_factory=list)
    error: str | None = None
    type: str = "poll"


@dataclass
class Final:
    """The reads after every fault healed: each partition read whole, read_committed, and
    the copiers' committed offsets."""

    process: str
    at: float
    records: list[Record] = field(default_factory=list)
    committed_offsets: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> off
    end_offsets: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> LSO
    # why the committed offsets could not be read stably (a transaction's offsets never
    # decided), else None
    offsets_error: str | None = None
    type: str = "final"


@dataclass
class Fault:
    """One fault of the nemesis, from injection to heal."""

    kind: str  # e.g. "partition-host", "leader-cut", "kill", "pause", "clock-skew"
    start: float
    end: float
    detail: str = ""
    process: str = "nemesis"
    type: str = "fault"


Event = Txn | Poll | Final | Fault
_KINDS: dict[str, type[Any]] = {"txn": Txn, "poll": Poll, "final": Final, "fault": Fault}


def tp(topic: str, partition: int) -> str:
    """The key of a partition in offset maps: ``topic/partition``."""
    return f"{topic}/{partition}"


def copy_value(txn: str, value: str) -> str:
    """The value a copier's transaction ``txn`` writes for input ``value``."""
    return f"{COPY_PREFIX}{txn}/{value}"


def copy_source(value: str) -> tuple[str, str] | None:
    """(copier transaction, input value) of a copy, or None for a value that is not one."""
    if not value.startswith(COPY_PREFIX):
        return None
    txn, sep, source = value[len(COPY_PREFIX) :].partition("/")
    return (txn, source) if sep else None


def encode(event: Event) -> str:
    return json.dumps(asdict(event), separators=(",", ":"))


def decode(line: str) -> Event:
    raw = json.loads(line)
    kind = _KINDS[raw["type"]]
    if kind is Txn:
        raw["intent"] = Intent(raw["intent"])
        raw["outcome"] = Outcome(raw["outcome"])
    for name in ("writes", "reads", "records"):
        if name in raw:
            raw[name] = [tuple(item) for item in raw[name]]
    event: Event = kind(**raw)
    return event


class Recorder:
    """One process's history file: each event appended and flushed as it happens."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def record(self, event: Event) -> None:
        self._file.write(encode(event) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_history(folder: Path) -> list[Event]:
    """Every event of every ``*.jsonl`` file under ``folder``, in time order. A torn last
    line (the process was killed while writing it) is skipped."""
    events: list[Event] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(decode(line))
            except (ValueError, KeyError, TypeError):
                continue
    events.sort(key=_when)
    return events


def _when(event: Event) -> float:
    if isinstance(event, Txn):
        return event.start
    if isinstance(event, Poll):
        return event.start
    if isinstance(event, Final):
        return event.at
    return event.start


def of_type(events: Iterable[Event], kind: type[Any]) -> Iterator[Any]:
    return (event for event in events if isinstance(event, kind))
