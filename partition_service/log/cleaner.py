"""Retention and compaction of one partition's log: which closed segments may go, and how
``__consumer_offsets`` keeps only the latest committed offset of each group and partition.

Only whole closed segments are ever deleted, never the active one, and only from the head
of the log, so the log stays one contiguous run of offsets (recovery checks that every
batch continues the one before it). The log start offset moves to the first segment kept.

**How far deletion may go.** On a leader, never past the high watermark (Kafka's rule: the
log start may only advance up to it, so nothing a reader or a follower has not been able
to see is deleted) and never past the last stable offset: an open transaction's batches
stay until its marker is written, so a read_committed reader never meets a marker whose
batches are gone, and the transaction's producer state and aborted range stay whole. The
LSO is at or below the high watermark, so it is the bound in practice; both are stated
because each is a rule of its own. A follower does not decide: it moves its log start to
its leader's (learned from every fetch answer, as Kafka's followers do), bounded by its
own high watermark, and deletes its segments below it.

**Retention** (``retention_ms``, ``retention_bytes``; -1 each: unlimited): from the head,
a closed segment goes while its newest batch was appended more than ``retention_ms`` ago,
or while the log without it would still hold at least ``retention_bytes`` (Kafka's size
rule: the log is never cut below the limit). The first segment that may not go ends the
pass, so what remains is always a suffix of the log.

**Compaction** of ``__consumer_offsets``: the partition's committed offsets view knows
where the record holding each committed value lies (``GroupOffsetsView.written_at``).
Before the head segment may go, every committed value whose record is in it is copied
forward: appended again at the log end as a plain (non-transactional) record with the same
value, which changes no group's offsets. Once every current value lies above the head
segments and below the bound, those segments are deleted. Superseded records and aborted
transactional commits go with them; a pending transactional commit is never in a
deletable segment (it lies above the LSO), so it is never lost; its COMMIT marker still
makes it the group's value. Compaction thus keeps only the latest value of each key while
the offsets of the log stay contiguous.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from eos_protocol.coordinator import UNLIMITED_RETENTION
from partition_service.log.engine import PartitionEngine, Row
from partition_service.log.group_offsets import encode_offset_record


@dataclass(frozen=True)
class RetentionPolicy:
    """A topic's retention as the controller told this node; -1 each: unlimited."""

    ms: int = UNLIMITED_RETENTION
    bytes: int = UNLIMITED_RETENTION

    @property
    def unlimited(self) -> bool:
        return self.ms < 0 and self.bytes < 0


@dataclass(frozen=True)
class SegmentView:
    """What the deletion rule needs of a closed segment."""

    base_offset: int
    end_offset: int  # the next segment's base offset
    size: int
    max_time_ms: int


@dataclass(frozen=True)
class CleanResult:
    """What one pass did: the (base offset, size) of each deleted segment, and how many
    records compaction copied forward."""

    deleted: list[tuple[int, int]]
    copied: int = 0

    @property
    def deleted_bytes(self) -> int:
        return sum(size for _base, size in self.deleted)


NOTHING = CleanResult([])


def retention_cut(
    closed: Iterable[SegmentView],
    *,
    total_bytes: int,
    policy: RetentionPolicy,
    now_ms: int,
    bound: int,
) -> int | None:
    """The new log start after retention: the end of the last head segment to delete
    (None: none may go). ``closed`` are the closed segments from the head, read lazily so
    a segment's newest time is looked up only when the rule reaches it; ``total_bytes`` is
    the size of the whole log; no segment ending above ``bound`` goes."""
    if policy.unlimited:
        return None
    cut: int | None = None
    remaining = total_bytes
    for segment in closed:
        if segment.end_offset > bound:
            break
        expired = policy.ms >= 0 and now_ms - segment.max_time_ms > policy.ms
        oversized = policy.bytes >= 0 and remaining - segment.size >= policy.bytes
        if not (expired or oversized):
            break
        remaining -= segment.size
        cut = segment.end_offset
    return cut


def deletion_bound(engine: PartitionEngine) -> int:
    """How far a leader may delete: the high watermark and the LSO (see above)."""
    return min(engine.high_watermark, engine.last_stable_offset)


def closed_segments(engine: PartitionEngine) -> Iterator[SegmentView]:
    log = engine.log
    for i, segment in enumerate(log.segments[:-1]):
        yield SegmentView(
            segment.base_offset, log.segment_end(i), segment.size, segment.max_append_time_ms()
        )


def apply_retention(engine: PartitionEngine, policy: RetentionPolicy, now_ms: int) -> CleanResult:
    """One retention pass on a leader's log."""
    total = sum(segment.size for segment in engine.log.segments)
    cut = retention_cut(
        closed_segments(engine), total_bytes=total, policy=policy, now_ms=now_ms,
        bound=deletion_bound(engine),
    )  # fmt: skip
    if cut is None:
        return NOTHING
    return CleanResult(engine.advance_log_start(cut))


def follow_leader_start(engine: PartitionEngine, leader_log_start: int) -> CleanResult:
    """A follower moves its log start to its leader's, bounded by its own high
    watermark, deleting the closed segments wholly below it."""
    target = min(leader_log_start, engine.high_watermark)
    if target <= engine.log_start_offset:
        return NOTHING
    return CleanResult(engine.advance_log_start(target))


def compact_offsets(engine: PartitionEngine, now_ms: int) -> CleanResult:
    """One compaction pass on a leader's ``__consumer_offsets`` partition: copy the head
    segment's live values forward, or, once there are none, delete the head segments
    whose values all lie above them (see above)."""
    view = engine.groups
    log = engine.log
    if view is None or len(log.segments) < 2:
        return NOTHING
    bound = deletion_bound(engine)
    head_end = log.segment_end(0)
    if head_end > bound:
        return NOTHING
    live = view.live_below(head_end)
    if live:
        rows: list[Row] = [
            (*encode_offset_record(*key, *value), None, now_ms) for key, value in live
        ]
        engine.append_data(rows, now_ms=now_ms)
        return CleanResult([], copied=len(rows))
    if any(at >= bound for at in view.written_at.values()):
        return NOTHING  # a current value not yet below the bound: its copy may be lost
    cut = None
    for i in range(len(log.segments) - 1):
        end = log.segment_end(i)
        if end > bound or view.live_below(end):
            break
        cut = end
    if cut is None:
        return NOTHING
    return CleanResult(engine.advance_log_start(cut))
