"""A partition led by this node: the engine, its group commit and its readers.

This is where requests meet the log: a produce is validated and appended in one step of the
event loop (so no other request can interleave between the idempotence check and the
write), then waits for group commit; a fetch can wait for the high watermark or the LSO to
move (long polling).
"""

from __future__ import annotations

import asyncio
import binascii
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from eos_protocol.errors import (
    InvalidRecordError,
    InvalidRequestError,
    MessageTooLargeError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
)
from eos_protocol.node import Encoding, ProduceRequest, RecordIn
from eos_protocol.parsing import collector_paused
from partition_service.group_commit import Durability, GroupCommitter
from partition_service.log.batch import DEFAULT_SLOT, NO_PRODUCER_ID, NO_SEQUENCE
from partition_service.log.cleaner import RetentionPolicy
from partition_service.log.engine import AppendResult, PartitionEngine, ReadResult, Row
from partition_service.replication.isr import LeaderReplicas
from partition_service.replication.role import Role
from partition_service.verification_guard import VerificationGuards

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


#: How long an acks=all write waits for the in-sync replicas (Kafka's request.timeout.ms).
REPLICATION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Limits:
    max_record_bytes: int = 1024 * 1024
    max_batch_records: int = 100_000
    max_fetch_records: int = 100_000


class Partition:
    def __init__(
        self,
        engine: PartitionEngine,
        *,
        durability: Durability,
        limits: Limits,
        clock: Callable[[], int] = now_ms,
        node_id: int = 1,
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.clock = clock
        self.role = Role(node_id)  # led here alone until a controller says otherwise
        # the topic's retention (from the controller's assignment) and, while following,
        # the leader's log start from its last fetch answer: what retention acts on
        self.retention = RetentionPolicy()
        self.leader_log_start: int | None = None
        self._changed = asyncio.Event()
        # events of waits over many partitions (a follower's fetch-many), set at each change
        self.watchers: set[asyncio.Event] = set()
        self.committer = GroupCommitter(engine, durability, on_durable=self.notify)
        self.verifications = VerificationGuards()

    @property
    def topic(self) -> str:
        return self.engine.topic

    @property
    def index(self) -> int:
        return self.engine.partition

    def start(self) -> None:
        self.committer.start()

    async def stop(self) -> None:
        await self.committer.stop()
        self.engine.close()

    async def discard(self) -> None:
        """Stop serving for good: its topic is deleted (``PartitionRegistry.delete_topics``,
        which has already taken it out of the registry). Unlike ``stop`` nothing is flushed
        or checkpointed, as its directory goes next. Every request still holding it is
        answered UNKNOWN_TOPIC_OR_PARTITION (``Role.require_present``): a batch waiting to
        be durable or replicated, a long poll (woken here), a marker; the followers' view
        goes with the leadership, so a replica fetch parked here answers that this node
        stopped leading. Then the files are closed: nothing may read or write them after,
        as their descriptors' numbers are soon another file's."""
        self.role.deleted = True
        self.role.leader = None
        await self.committer.stop_loop()
        self.committer.abandon(f"partition {self.topic}-{self.index} was deleted")
        self.notify()
        self.engine.close()

    def finish(self) -> int:
        """The part of ``stop`` after the commit loop has ended (``stop_loop``): the final
        flush and checkpoint, then the files closed; its durable offset. No event loop
        needed: the registry runs it on threads, many partitions at once."""
        try:
            return self.committer.final_flush()
        finally:
            self.engine.close()

    def notify(self) -> None:
        self.advance_high_watermark()
        self._changed.set()
        self._changed = asyncio.Event()
        for watcher in self.watchers:
            watcher.set()

    # -- replication ---------------------------------------------------------------------
    def advance_high_watermark(self) -> None:
        """While leading a replicated partition, the high watermark is what the in-sync
        replicas have (``LeaderReplicas``); alone, it is what is durable here."""
        leader = self.role.leader
        assignment = self.role.assignment
        if leader is not None and assignment is not None and assignment.replicated:
            self.engine.replicated_offset = leader.advance_high_watermark(
                self.engine.durable_offset
            )

    def on_replica_fetch(self, replica: int, fetch_offset: int) -> None:
        """A follower fetched from ``fetch_offset``: it has everything below."""
        leader = self.role.leader
        if leader is None:
            return
        leader.on_fetch(replica, fetch_offset, self.engine.log_end_offset, self.clock())
        self.notify()

    async def changed_within(self, timeout_s: float) -> bool:
        """Wait for the next change of this partition's offsets (an append made durable, a
        marker, a follower's fetch, a new role); False when ``timeout_s`` passed first.
        The one wait of every long poll here: fetches, follower fetches, acks=all."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True

    async def wait_replicated(
        self, end: int, timeout_s: float, leader_epoch: int | None
    ) -> None:
        """Until the high watermark reaches ``end`` (acks=all), then Kafka's
        ``checkEnoughReplicasReachOffset``: acknowledged only if, once the high watermark
        covers the write, at least ``min_insync_replicas`` replicas are in sync.

        The check runs when the wait ends, not only while it waits: when the ISR shrinks to
        the leader alone the high watermark jumps to the leader's log end, so a wait that
        only looked inside its loop would acknowledge a write no follower has. Every ISR
        member holds everything under the high watermark, so "covered and enough in sync"
        means the write is on that many replicas. Refused too if this replica stopped
        leading, or leads again in another epoch (its log may have been truncated and
        written over since the append), at ``leader_epoch``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self._leader_of(leader_epoch)
            if leader is not None and not leader.enough_in_sync():
                raise NotEnoughReplicasAfterAppendError(
                    f"written, but the in-sync replicas {leader.isr} are fewer than "
                    f"min_insync_replicas {leader.min_insync_replicas}"
                )
            if self.engine.high_watermark >= end:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NotEnoughReplicasAfterAppendError(
                    f"written, but not on every in-sync replica within {timeout_s:.1f}s"
                )
            await self.changed_within(min(remaining, 0.5))  # and look again twice a second

    def _leader_of(self, leader_epoch: int | None) -> LeaderReplicas | None:
        """The follower view of this replica's leadership in ``leader_epoch``; refused
        (NOT_LEADER_OR_FOLLOWER and kin) once it no longer leads in that epoch."""
        self.role.require_leader()
        if self.role.leader_epoch != leader_epoch:
            raise NotLeaderOrFollowerError(
                f"leadership of {self.topic}-{self.index} moved from epoch {leader_epoch} to "
                f"{self.role.leader_epoch} while a write waited for its replicas"
            )
        return self.role.leader

    # -- produce -------------------------------------------------------------------------
    def validate_rows(self, request: ProduceRequest, *, body_bytes: int | None = None) -> list[Row]:
        """Check the request's producer fields and turn its records into rows, refusing bad
        input before anything is written. ``body_bytes``, the size of the JSON body the
        request was parsed from, bounds the size of every record in it."""
        if self.engine.groups is not None:  # as Kafka refuses appends to internal topics
            raise InvalidRequestError(
                f"{self.topic} is internal: a group's offsets are committed through "
                "/v1/groups/{group_id}/offsets and /v1/groups/{group_id}/txn-offsets"
            )
        has_producer = request.producer_id is not None
        if has_producer and (request.producer_epoch is None or request.base_sequence is None):
            raise InvalidRequestError(
                "producer_id needs producer_epoch and base_sequence in the same request"
            )
        if not has_producer and (
            request.producer_epoch is not None or request.base_sequence is not None
        ):
            raise InvalidRequestError("producer_epoch and base_sequence need a producer_id")
        if not has_producer and request.slot is not None:
            raise InvalidRequestError(
                "a slot numbers a producer's sequences: it needs a producer_id"
            )
        if has_producer and request.acks != -1:
            raise InvalidRequestError("an idempotent or transactional batch needs acks -1 (all)")
        if request.transactional and not has_producer:
            raise InvalidRequestError(
                "a transactional batch needs producer_id, producer_epoch and base_sequence"
            )
        return self.rows(
            request.records, base64=request.encoding is Encoding.BASE64, body_bytes=body_bytes
        )

    def rows(
        self, records: list[RecordIn], *, base64: bool = False, body_bytes: int | None = None
    ) -> list[Row]:
        if not records:
            raise InvalidRecordError("a batch needs at least one record")
        if len(records) > self.limits.max_batch_records:
            raise MessageTooLargeError(
                f"{len(records)} records in one batch; at most {self.limits.max_batch_records}"
            )
        now = self.clock()
        limit = self.limits.max_record_bytes
        if not base64 and body_bytes is not None and body_bytes <= limit:
            # Each character of a key or value took at least one byte of the JSON body, so
            # no record can be over the limit: nothing to check record by record.
            return [
                (r.key, r.value, r.headers, now if r.timestamp_ms is None else r.timestamp_ms)
                for r in records
            ]
        rows: list[Row] = []
        for i, record in enumerate(records):
            key, value = record.key, record.value
            size = (len(key) if key else 0) + (len(value) if value else 0)
            if size > limit:
                raise MessageTooLargeError(
                    f"record {i} has {size} bytes of key and value; at most {limit}"
                )
            if base64:
                _check_base64(key, i, "key")
                _check_base64(value, i, "value")
            ts = record.timestamp_ms if record.timestamp_ms is not None else now
            rows.append((key, value, record.headers, ts))
        return rows

    def append(self, request: ProduceRequest, rows: list[Row]) -> AppendResult:
        """Check and write in one step of the event loop; durability is awaited after."""
        return self.append_rows(
            rows,
            producer_id=request.producer_id if request.producer_id is not None else NO_PRODUCER_ID,
            producer_epoch=request.producer_epoch if request.producer_epoch is not None else -1,
            base_sequence=request.base_sequence
            if request.base_sequence is not None
            else NO_SEQUENCE,
            transactional=request.transactional,
            base64=request.encoding is Encoding.BASE64,
            slot=request.slot if request.slot is not None else DEFAULT_SLOT,
        )

    def append_rows(
        self,
        rows: list[Row],
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        base64: bool = False,
        slot: int = DEFAULT_SLOT,
    ) -> AppendResult:
        return self.engine.append_data(
            rows,
            now_ms=self.clock(),
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
            base64=base64,
            slot=slot,
        )

    def needs_verification(self, producer_id: int, producer_epoch: int) -> bool:
        """A transactional batch that would open a transaction here must be verified first."""
        entry = self.engine.producers.producers.get(producer_id)
        return (
            entry is None or entry.current_txn_first_offset is None or producer_epoch != entry.epoch
        )

    async def wait_durable(self, result: AppendResult, *, acks_all: bool = True) -> None:
        """Until the batch is on disk here and, with ``acks_all`` on a replicated
        partition, on at least ``min_insync_replicas`` in-sync replicas. Called right after
        the append, before anything else ran on the loop: the leader epoch read here is the
        one the batch was written in."""
        leader_epoch = self.role.leader_epoch
        await self.committer.wait_durable(result.last_offset + 1)
        if acks_all:
            await self._wait_in_sync(result.last_offset + 1, leader_epoch)

    async def _wait_in_sync(self, end: int, leader_epoch: int | None) -> None:
        assignment = self.role.assignment
        if assignment is not None and assignment.replicated:
            await self.wait_replicated(end, REPLICATION_TIMEOUT_S, leader_epoch)

    # -- markers -------------------------------------------------------------------------
    async def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, result: str
    ) -> None:
        """Append a COMMIT/ABORT marker and answer once it is replicated as an acks=all
        write (as Kafka acknowledges markers). Leadership and the in-sync minimum are
        checked in the same step of the event loop as the append."""
        self.role.require_leader(acks_all=True)
        leader_epoch = self.role.leader_epoch
        self.verifications.invalidate(producer_id)
        offset = self.engine.append_marker(
            producer_id, producer_epoch, coordinator_epoch, result, now_ms=self.clock()
        )
        end = self.engine.log_end_offset if offset is None else offset + 1
        await self.committer.wait_durable(end)
        self.notify()
        await self._wait_in_sync(end, leader_epoch)

    # -- fetch ---------------------------------------------------------------------------
    async def fetch(
        self,
        offset: int,
        *,
        max_records: int,
        max_bytes: int,
        read_committed: bool,
        max_wait_ms: int,
        render: Callable[[ReadResult], T],
    ) -> T:
        """Read from ``offset`` (waiting up to ``max_wait_ms`` for records) and return
        ``render(result)``. The read and the rendering run with the collector paused, so
        the dict of every record is built and freed without a collection in between."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            self.role.require_present()  # deleted during the wait: its files are closed
            with collector_paused():
                result = self.engine.read(
                    offset,
                    max_records=max_records,
                    max_bytes=max_bytes,
                    read_committed=read_committed,
                )
                remaining = deadline - time.monotonic()
                if result.records or remaining <= 0 or result.next_offset > offset:
                    # next_offset > offset: skipped a gap, let the reader move on at once
                    answer = render(result)
                    del result  # free the records before the collector resumes
                    return answer
            if not await self.changed_within(remaining):
                return render(result)  # no records

    def offsets(self) -> dict[str, Any]:
        return {
            "log_start_offset": self.engine.log_start_offset,
            "high_watermark": self.engine.high_watermark,
            "last_stable_offset": self.engine.last_stable_offset,
        }


def _check_base64(text: str | None, index: int, field: str) -> None:
    if text is None:
        return
    try:
        binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise InvalidRecordError(f"record {index} {field} is not valid base64: {exc}") from exc
