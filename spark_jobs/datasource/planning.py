"""The driver's half of a read: which partitions, from where to where, in which tasks.

Everything a task reads is decided here, before the task runs, so that every attempt of a
task reads the same records: a ``Slice`` is ``[start, end)`` of one partition with ``end``
at most the partition's last stable offset (read_committed). Below the LSO every
transaction is decided, so the slice's committed records are the same on every read; a
micro-batch never includes a transaction that might still abort.

The batch reader and the stream reader share this module: the topics of ``subscribe`` /
``subscribePattern`` / ``assign``, each partition's bounds (log start, LSO or high
watermark), the ``startingOffsets``/``endingOffsets`` specs, records lost to retention
(``failOnDataLoss``), the filters a batch read pushes down, and the cut of long ranges
into several tasks.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sdk import AdminClient, TopicPartition, UnknownTopicOrPartitionError
from spark_jobs.datasource.options import EARLIEST, LATEST, EosOptionError, SourceOptions

log = logging.getLogger(__name__)

#: ``{"topic": {"partition": offset}}``: Spark's offsets of this source (JSON keys are text).
OffsetMap = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Bounds:
    """A partition's offsets now: records start at ``start``; a read stops at ``end``
    (the LSO read_committed, the high watermark read_uncommitted)."""

    start: int
    end: int


@dataclass(frozen=True)
class Slice:
    """Offsets ``[start, end)`` of one partition: one task's read."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass
class Pushed:
    """Filters a batch read applies itself: topics, partitions, an offset range."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    min_offset: int = 0
    max_offset: int | None = None  # exclusive
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None  # inclusive
    notes: list[str] = field(default_factory=list)

    def keep(self, topic: str, partition: int) -> bool:
        return (self.topics is None or topic in self.topics) and (
            self.partitions is None or partition in self.partitions
        )


def topics(options: SourceOptions, running: Collection[str] = ()) -> list[str]:
    """The topics the options name, checked to exist (an ``EosOptionError`` otherwise);
    a pattern matches whole names, as Kafka's does, and may match none yet.

    ``running``: the topics a streaming query has read so far. One of them gone now was
    deleted while the query ran (``deleted``), which is not a wrong option."""
    with options.connection.admin() as admin:
        existing = sorted(t.name for t in admin.describe_cluster().topics)
    if options.pattern is not None:
        rule = re.compile(options.pattern)
        return [t for t in existing if rule.fullmatch(t)]
    wanted = list(options.subscribe) if options.subscribe else sorted(options.assign or {})
    missing = [t for t in wanted if t not in existing]
    gone = [t for t in missing if t in running]
    if len(gone) < len(missing):
        raise EosOptionError(f"topic(s) {', '.join(t for t in missing if t not in gone)} "
                             "do not exist")  # fmt: skip
    if gone:
        deleted(options, gone)
    return [t for t in wanted if t not in gone]


def deleted(options: SourceOptions, names: Sequence[str]) -> None:
    """Topics a streaming query read were deleted: with ``failOnDataLoss`` (the default)
    the query stops here, before its next batch, saying so; without, it goes on without
    them, with a warning (Kafka's source does the same)."""
    message = (
        f"topic(s) {', '.join(names)} were deleted while the query ran: records not yet "
        "read from them are lost"
    )
    if options.fail_on_data_loss:
        raise RuntimeError(message + "; set failOnDataLoss=false to go on without them")
    log.warning("%s; going on without them", message)


def bounds(
    options: SourceOptions, names: Iterable[str], running: Collection[str] = ()
) -> dict[TopicPartition, Bounds]:
    """Every wanted partition of ``names`` with its bounds now (``running`` as for
    ``topics``: a topic the query read that is deleted meanwhile is ``deleted``)."""
    found: dict[TopicPartition, Bounds] = {}
    with options.connection.admin() as admin:
        for topic in names:
            try:
                found.update(_topic_bounds(options, admin, topic))
            except UnknownTopicOrPartitionError:
                # deleted before or while its partitions were asked (the metadata a
                # coordinator answers from may name it a moment after its nodes dropped it)
                if options.pattern is not None:
                    continue  # deleted since it matched
                if topic in running:
                    deleted(options, [topic])
                    continue
                raise
    return found


def _topic_bounds(
    options: SourceOptions, admin: AdminClient, topic: str
) -> dict[TopicPartition, Bounds]:
    """The bounds of the wanted partitions of one topic."""
    count = len(admin.describe_topic(topic).partitions)
    wanted: Iterable[int] = range(count)
    if options.assign is not None:
        missing = [p for p in options.assign.get(topic, ()) if p >= count]
        if missing:
            raise EosOptionError(f"option assign: {topic} has no partition {missing}")
        wanted = options.assign.get(topic, ())
    found: dict[TopicPartition, Bounds] = {}
    for p in wanted:
        tp = TopicPartition(topic, p)
        offsets = admin.list_offsets(tp)
        end = offsets.last_stable_offset if options.read_committed else offsets.high_watermark
        found[tp] = Bounds(offsets.log_start_offset, end)
    return found


def resolve(
    spec: str | dict[str, dict[int, int]] | None,
    default: str,
    tp: TopicPartition,
    at: Bounds,
) -> int:
    """One partition's offset from a spec: ``earliest``/``latest``/JSON (-2/-1)."""
    if spec is None:
        spec = default
    if isinstance(spec, str):
        return at.start if spec == "earliest" else at.end
    offset = spec.get(tp.topic, {}).get(tp.partition)
    if offset is None:
        offset = EARLIEST if default == "earliest" else LATEST
    if offset == EARLIEST:
        return at.start
    if offset == LATEST:
        return at.end
    return offset


def check_lost(options: SourceOptions, tp: TopicPartition, start: int, at: Bounds) -> int:
    """``start`` if its records still exist; else the log start (failOnDataLoss=false, with
    a warning) or an error naming the partition and the offsets lost."""
    if start >= at.start:
        return start
    message = (
        f"{tp.topic}-{tp.partition}: offsets {start}..{at.start - 1} are gone "
        f"(the log starts at {at.start}; removed by retention)"
    )
    if options.fail_on_data_loss:
        raise RuntimeError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping to %d", message, at.start)
    return at.start


def split(
    ranges: Sequence[Slice], max_offsets: int, min_partitions: int | None
) -> list[Slice]:
    """Cut ranges longer than ``max_offsets``, and cut further until there are at least
    ``min_partitions`` slices (Kafka's ``minPartitions``), longest first."""
    out: list[Slice] = []
    for r in ranges:
        start = r.start
        while r.end - start > max_offsets:
            out.append(Slice(r.topic, r.partition, start, start + max_offsets))
            start += max_offsets
        out.append(Slice(r.topic, r.partition, start, r.end))
    while min_partitions is not None and len(out) < min_partitions:
        longest = max(out, key=lambda s: s.size, default=None)
        if longest is None or longest.size < 2:
            break
        out.remove(longest)
        middle = longest.start + longest.size // 2
        out += [
            Slice(longest.topic, longest.partition, longest.start, middle),
            Slice(longest.topic, longest.partition, middle, longest.end),
        ]
    return sorted((s for s in out if s.size > 0), key=lambda s: (s.topic, s.partition, s.start))


def to_offsets(positions: Mapping[TopicPartition, int]) -> OffsetMap:
    """Offsets as Spark stores them (JSON: text keys, sorted)."""
    out: OffsetMap = {}
    for tp in sorted(positions):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(positions[tp])
    return out


def from_offsets(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        TopicPartition(topic, int(p)): int(o)
        for topic, parts in offsets.items()
        for p, o in parts.items()
    }
