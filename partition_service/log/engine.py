"""One partition's log engine: appends with idempotence and transactions, markers, reads,
and what a replica needs: frames copied from a leader, and truncation after a leader change.

Synchronous and free of HTTP so it can be tested, fuzzed and benchmarked on its own. The
asynchronous layer above it (``partition_service.partition``) adds group commit: it calls
``mark_durable`` once a fsync covers an offset, and only then are records counted below the
high watermark, shown to readers and acknowledged to producers. With replication the high
watermark is also bounded by what the in-sync replicas have (``replicated_offset``, set by
``partition_service.replication``).

Every state derived from the log (producer state, the aborted-transaction index, group
offsets, the leader-epoch cache) is rebuilt from the batches themselves, whether they were
appended here as leader or copied from a leader as follower, so a follower that becomes
leader has the same idempotence, fencing and read_committed state as its old leader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.errors import InvalidRecordError, OffsetOutOfRangeError
from partition_service.log import batch as frames
from partition_service.log.batch import (
    DEFAULT_SLOT,
    FLAG_BASE64,
    FLAG_CONTROL,
    FLAG_TRANSACTIONAL,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
)
from partition_service.log.epochs import LeaderEpochCache, StaleEpochError
from partition_service.log.group_offsets import GroupOffsetsView
from partition_service.log.log import CHECKPOINT_FILE, Checkpoint, Log, LogConfig, read_checkpoint
from partition_service.log.producer_state import ProducerStateManager
from partition_service.log.segment import Segment
from partition_service.log.txn_index import AbortedTxn, AbortedTxnIndex

Row = tuple[str | None, str | None, dict[str, str] | None, int]
COMMIT, ABORT = "COMMIT", "ABORT"


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool
    append_time_ms: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: list[dict[str, Any]]
    next_offset: int


class PartitionEngine:
    """The log of one partition with the state derived from it."""

    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.config = config
        directory.mkdir(parents=True, exist_ok=True)
        self.log = Log(directory, config)
        self.producers = ProducerStateManager()
        aborted_path = directory / "aborted.txnindex"
        # Looked at before the index opens (and so creates) its file.
        self._aborted_lost = not aborted_path.exists() and any(directory.glob("*.log"))
        self.aborted = AbortedTxnIndex(aborted_path)
        self.epochs = LeaderEpochCache(directory)
        self.groups = GroupOffsetsView() if topic == CONSUMER_OFFSETS_TOPIC else None
        self.durable_offset = 0  # every offset below it is on disk
        # What the in-sync replicas have (None: not replicated); the high watermark is the
        # smaller of the two.
        self.replicated_offset: int | None = None
        self.leader_epoch = 0  # stamped on every batch this replica appends as leader

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Recover the log and rebuild the state: checkpoint, then replay of the tail.

        A log whose aborted-transaction index or leader-epoch file is gone (deleted, lost,
        written by a version without it) must not start from its checkpoint: the aborts or
        epochs before it would be forgotten. Replaying the whole log writes both again."""
        has_log = any(self.directory.glob("*.log"))
        epochs_lost = not self.epochs.load() and has_log
        rebuild = self._aborted_lost or epochs_lost
        self._aborted_lost = False
        self.aborted.load(2**63)
        self.log.open(self._restore, self._replay, use_checkpoint=not rebuild)
        self.aborted.truncate_from(self.log.next_offset)
        self.aborted.truncate_before(self.log.log_start_offset)
        self.epochs.truncate_from_end(self.log.next_offset)
        self.leader_epoch = max(self.leader_epoch, self.epochs.latest_epoch, 0)
        self.durable_offset = self.log.next_offset

    def _restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self.producers = ProducerStateManager()
            self.groups = GroupOffsetsView() if self.groups is not None else None
            self.aborted.truncate_from(0)
            self.epochs.clear()  # the replay assigns every epoch again
            return
        self.producers = ProducerStateManager.from_json(state.get("producers", []))
        if self.groups is not None:
            self.groups = GroupOffsetsView.from_json(state.get("groups", {}))

    def _replay(self, header: BatchHeader, segment: Segment) -> None:
        """Apply a batch read back from the log during recovery."""

        def payload() -> Any:
            return frames.payload_of(segment.read(header.position, header.frame_size), 0, header)

        self._apply_batch(header, payload)

    def _apply_batch(self, header: BatchHeader, payload: Callable[[], Any]) -> None:
        """Bring the derived state up to date with one batch already in the log: replayed
        in recovery or copied from a leader."""
        if header.leader_epoch > self.epochs.latest_epoch:
            self.epochs.assign(header.leader_epoch, header.base_offset)
        if header.is_control:
            body = payload()
            self._apply_marker(
                header.producer_id,
                header.producer_epoch,
                int(body["coordinator_epoch"]),
                str(body["type"]),
                header.base_offset,
                header.append_time_ms,
            )
            return
        if header.has_producer:
            self.producers.apply_data(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.base_offset,
                header.last_offset,
                header.append_time_ms,
                transactional=header.is_transactional,
                slot=header.slot,
            )
        if self.groups is not None:
            self.groups.apply_records(
                payload(), header.producer_id, transactional=header.is_transactional,
                base_offset=header.base_offset,
            )  # fmt: skip

    def close(self) -> None:
        self.log.close()
        self.aborted.close()

    # -- offsets -------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.next_offset

    @property
    def high_watermark(self) -> int:
        if self.replicated_offset is None:
            return self.durable_offset
        return min(self.durable_offset, self.replicated_offset)

    @property
    def last_stable_offset(self) -> int:
        first_open = self.producers.first_unstable_offset()
        hw = self.high_watermark
        return hw if first_open is None else min(first_open, hw)

    def mark_durable(self, offset: int) -> None:
        self.durable_offset = max(self.durable_offset, offset)

    # -- writes --------------------------------------------------------------------------
    def append_data(
        self,
        rows: list[Row],
        *,
        now_ms: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        base64: bool = False,
        slot: int = DEFAULT_SLOT,
    ) -> AppendResult:
        """Validate and write one batch (not yet durable); a duplicate writes nothing.
        ``slot`` picks the producer's sequence space (``producer_state``); it is written
        into the frame so that replicas and recovery see it."""
        count = len(rows)
        if producer_id != NO_PRODUCER_ID:
            check = self.producers.check_append(
                producer_id,
                producer_epoch,
                base_sequence,
                count,
                transactional=transactional,
                slot=slot,
            )
            if check.duplicate_of is not None:
                meta = check.duplicate_of
                return AppendResult(meta.base_offset, meta.last_offset, True, meta.append_time_ms)
        base_offset = self.log.next_offset
        flags = (FLAG_TRANSACTIONAL if transactional else 0) | (FLAG_BASE64 if base64 else 0)
        try:
            payload = frames.encode_records(rows)
        except orjson.JSONEncodeError as exc:  # e.g. a lone surrogate in a string
            raise InvalidRecordError(f"a record cannot be stored: {exc}") from exc
        frame = frames.encode(
            base_offset=base_offset,
            record_count=count,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            flags=flags,
            append_time_ms=now_ms,
            payload=payload,
            leader_epoch=self.leader_epoch,
            slot=slot,
        )
        self._note_epoch(base_offset)
        self.log.append(frame, base_offset, base_offset + count, now_ms)
        last_offset = base_offset + count - 1
        if producer_id != NO_PRODUCER_ID:
            self.producers.apply_data(
                producer_id,
                producer_epoch,
                base_sequence,
                base_offset,
                last_offset,
                now_ms,
                transactional=transactional,
                slot=slot,
            )
        if self.groups is not None:
            self.groups.apply_records(
                [list(r) for r in rows], producer_id, transactional=transactional,
                base_offset=base_offset,
            )  # fmt: skip
        return AppendResult(base_offset, last_offset, False, now_ms)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        result: str,
        *,
        now_ms: int,
    ) -> int | None:
        """Write a COMMIT/ABORT control batch; returns its offset (None: nothing to do)."""
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if self.producers.marker_is_noop(producer_id, producer_epoch):
            entry = self.producers.producers.get(producer_id)
            if entry is not None:
                entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
            return None
        offset = self.log.next_offset
        frame = frames.encode(
            base_offset=offset,
            record_count=1,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=NO_SEQUENCE,
            flags=FLAG_CONTROL | FLAG_TRANSACTIONAL,
            append_time_ms=now_ms,
            payload=frames.encode_control(result, coordinator_epoch),
            leader_epoch=self.leader_epoch,
        )
        self._note_epoch(offset)
        self.log.append(frame, offset, offset + 1, now_ms)
        self._apply_marker(producer_id, producer_epoch, coordinator_epoch, result, offset, now_ms)
        return offset

    def _apply_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        result: str,
        offset: int,
        now_ms: int,
    ) -> None:
        first = self.producers.apply_marker(
            producer_id, producer_epoch, coordinator_epoch, now_ms, offset
        )
        if result == ABORT and first is not None:
            self.aborted.append(AbortedTxn(producer_id, first, offset))
        if self.groups is not None:
            self.groups.apply_marker(producer_id, commit=result == COMMIT)

    def _note_epoch(self, offset: int) -> None:
        """The first batch of a leader epoch starts the epoch's entry."""
        if self.leader_epoch > self.epochs.latest_epoch:
            self.epochs.assign(self.leader_epoch, offset)

    # -- replication ---------------------------------------------------------------------
    def become_leader(self, epoch: int) -> None:
        """Lead from now on in ``epoch``: it begins at the log end (Kafka assigns the new
        epoch's start offset when a replica becomes leader, before any append)."""
        if epoch < self.epochs.latest_epoch:
            raise StaleEpochError(f"epoch {epoch} is older than {self.epochs.latest_epoch}")
        self.leader_epoch = epoch
        self.epochs.assign(epoch, self.log_end_offset)

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """Where ``epoch`` ended in this log (``LeaderEpochCache.end_offset_for``)."""
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    def read_frames(self, offset: int, max_bytes: int) -> bytes:
        """Whole frames from ``offset`` (a batch boundary, or the log end: nothing) up to
        the log end, at least one and about ``max_bytes``: what a follower copies."""
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        chunks: list[bytes] = []
        size = 0
        for header, view, start in self.log.batches_from(offset):
            if not chunks and header.base_offset != offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is inside the batch at {header.base_offset}"
                )
            if chunks and size + header.frame_size > max_bytes:
                break
            chunks.append(bytes(view[start : start + header.frame_size]))
            size += header.frame_size
        return b"".join(chunks)

    def append_replicated(self, data: bytes) -> int:
        """Append frames copied from the leader, byte for byte at the same offsets, and
        bring the derived state up to date; returns how many batches. Not yet durable.

        Every frame is checked (CRC, and that it continues this log) before any is
        written, so a damaged answer changes nothing."""
        view = memoryview(data)
        headers: list[BatchHeader] = []
        start, expected = 0, self.log_end_offset
        while start < len(view):
            header = frames.decode_header(view, start, start, verify=True)
            if header.base_offset != expected:
                raise frames.CorruptBatchError(
                    f"a copied batch at offset {header.base_offset} where {expected} was expected"
                )
            headers.append(header)
            expected = header.next_offset
            start += header.frame_size
        for header in headers:
            frame = view[header.position : header.position + header.frame_size]
            self.log.append(
                bytes(frame), header.base_offset, header.next_offset, header.append_time_ms
            )
            self._apply_batch(header, partial(frames.payload_of, frame, 0, header))
        return len(headers)

    def truncate_to(self, offset: int) -> int:
        """Cut the log so that it ends at or before ``offset``, at a batch boundary, and
        rebuild what was derived from the cut batches; returns the new log end.

        A follower does this after a leader change, at the end offset the new leader
        gives for the follower's last epoch. The derived state is rebuilt by recovery:
        from the checkpoint when it lies below the cut, else by replaying the log."""
        if offset >= self.log_end_offset:
            return self.log_end_offset
        cut = max(offset, self.log_start_offset)
        for header, _view, _start in self.log.batches_from(cut):
            cut = header.base_offset
            break
        checkpoint = read_checkpoint(self.directory)
        if checkpoint is not None and checkpoint.next_offset > cut:
            (self.directory / CHECKPOINT_FILE).unlink()
        self.log.truncate_to(cut)
        self.aborted.truncate_from(cut)
        self.epochs.truncate_from_end(cut)
        self._reopen()
        return self.log_end_offset

    def _reopen(self) -> None:
        """Recover again from the files, keeping the role (epoch, replicated offset)."""
        epoch, replicated = self.leader_epoch, self.replicated_offset
        self.close()
        self.log = Log(self.directory, self.config)
        self.aborted = AbortedTxnIndex(self.directory / "aborted.txnindex")
        self.epochs = LeaderEpochCache(self.directory)
        self.groups = GroupOffsetsView() if self.groups is not None else None
        self.open()
        self.leader_epoch = max(epoch, self.epochs.latest_epoch, 0)
        if replicated is not None:
            self.replicated_offset = min(replicated, self.log_end_offset)

    # -- the log start (retention) -------------------------------------------------------
    def advance_log_start(self, offset: int) -> list[tuple[int, int]]:
        """Move the log start to ``offset`` and delete the closed segments below it
        (``Log.advance_start``); the aborted-transaction index is trimmed with them. The
        producer state is not: a producer whose batches all went keeps its sequence until
        it has been idle for ``producer_expiration_ms`` (``expire_producers``), as in Kafka
        since KIP-360. Forgotten with its batches, an idle idempotent producer's next batch
        would be refused ``UNKNOWN_PRODUCER_ID`` on a low-traffic topic. The caller bounds
        ``offset`` (``partition_service.log.cleaner``: the high watermark and the LSO on a
        leader, the leader's log start on a follower). Returns the (base offset, size) of
        every deleted segment."""
        deleted = self.log.advance_start(offset)
        self.aborted.truncate_before(self.log.log_start_offset)
        return deleted

    def restart_at(self, offset: int) -> None:
        """Empty this replica and begin its log at ``offset``: a follower whose log ends
        below its leader's log start copies from there (Kafka's truncateFullyAndStartAt).
        Everything derived from the old log goes with it."""
        (self.directory / CHECKPOINT_FILE).unlink(missing_ok=True)
        self.log.restart_at(offset)
        self.aborted.truncate_from(0)
        self.epochs.clear()
        self.producers = ProducerStateManager()
        self.groups = GroupOffsetsView() if self.groups is not None else None
        self.durable_offset = offset
        if self.replicated_offset is not None:
            self.replicated_offset = max(self.replicated_offset, offset)

    # -- reads ---------------------------------------------------------------------------
    def read(
        self,
        offset: int,
        *,
        max_records: int,
        max_bytes: int,
        read_committed: bool,
    ) -> ReadResult:
        """Records from ``offset`` below the high watermark (or the LSO for read_committed).

        Control records are never returned; read_committed leaves out the records of
        aborted transactions. ``next_offset`` moves past whatever was skipped, so a reader
        that follows it never stalls on a gap.
        """
        upper = self.last_stable_offset if read_committed else self.high_watermark
        # Out of range only past the log end, as in Kafka: a new leader's high watermark
        # may trail the one its predecessor served until the followers fetch again, and a
        # reader positioned in that gap must wait, not reset to the earliest offset.
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        records: list[dict[str, Any]] = []
        next_offset = offset
        if offset >= upper:
            return ReadResult(records, next_offset)
        aborted = self.aborted.overlapping(offset, upper) if read_committed else {}
        size = 0
        for header, view, start in self.log.batches_from(offset):
            if header.base_offset >= upper or len(records) >= max_records or size >= max_bytes:
                break
            if header.is_control or (
                aborted
                and header.is_transactional
                and _in_ranges(aborted.get(header.producer_id), header.base_offset)
            ):
                next_offset = header.next_offset
                continue
            encoding = "base64" if header.is_base64 else "utf8"
            rows = frames.payload_of(view, start, header)
            record_offset = header.base_offset
            for key, value, headers, timestamp in rows:
                if record_offset >= offset:
                    records.append(
                        {
                            "offset": record_offset,
                            "key": key,
                            "value": value,
                            "headers": headers or {},
                            "timestamp_ms": timestamp,
                            "encoding": encoding,
                        }
                    )
                    next_offset = record_offset + 1
                    if len(records) >= max_records:
                        break
                record_offset += 1
            size += header.frame_size
        return ReadResult(records, next_offset)

    # -- checkpoints ---------------------------------------------------------------------
    def expire_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle longer than the configured expiration (none with an open
        transaction); run before a checkpoint so the checkpoint stays small."""
        return self.producers.expire(now_ms, self.log.config.producer_expiration_ms)

    def capture_checkpoint(self) -> Checkpoint:
        """The state right now, to be written once the log is durable up to it."""
        next_offset, segment, position, sizes = self.log.checkpoint_point()
        state: dict[str, Any] = {"producers": self.producers.to_json()}
        if self.groups is not None:
            state["groups"] = self.groups.to_json()
        return Checkpoint(next_offset, segment, position, sizes, state)

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        if checkpoint.next_offset > self.durable_offset:
            raise ValueError("a checkpoint may only cover durable offsets")
        self.log.write_checkpoint(checkpoint)

    def fsync(self) -> None:
        """Make every appended byte durable (log, then the aborted-transaction index)."""
        self.log.fsync()
        self.aborted.fsync()

    def for_each_producer(self, fn: Callable[[int], None]) -> None:
        for pid in list(self.producers.producers):
            fn(pid)


def _in_ranges(ranges: list[tuple[int, int]] | None, offset: int) -> bool:
    if not ranges:
        return False
    return any(first <= offset <= last for first, last in ranges)
