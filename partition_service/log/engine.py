"""One partition's log engine: appends with idempotence and transactions, markers, reads.

Synchronous and free of HTTP so it can be tested, fuzzed and benchmarked on its own. The
asynchronous layer above it (``partition_service.partition``) adds group commit: it calls
``mark_durable`` once a fsync covers an offset, and only then are records counted below the
high watermark, shown to readers and acknowledged to producers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.errors import InvalidRecordError, OffsetOutOfRangeError
from partition_service.log import batch as frames
from partition_service.log.batch import (
    FLAG_BASE64,
    FLAG_CONTROL,
    FLAG_TRANSACTIONAL,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
)
from partition_service.log.group_offsets import GroupOffsetsView
from partition_service.log.log import Checkpoint, Log, LogConfig
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
        directory.mkdir(parents=True, exist_ok=True)
        self.log = Log(directory, config)
        self.producers = ProducerStateManager()
        aborted_path = directory / "aborted.txnindex"
        # A log whose aborted-transaction index is gone (deleted, lost) must not start from
        # its checkpoint: the aborts before it would be forgotten and read_committed would
        # show their records. Replaying the whole log writes the index again.
        self._rebuild_aborted = not aborted_path.exists() and any(directory.glob("*.log"))
        self.aborted = AbortedTxnIndex(aborted_path)
        self.groups = GroupOffsetsView() if topic == CONSUMER_OFFSETS_TOPIC else None
        self.durable_offset = 0  # every offset below it is on disk: the high watermark

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Recover the log and rebuild the state: checkpoint, then replay of the tail."""
        self.aborted.load(2**63)
        self.log.open(self._restore, self._replay, use_checkpoint=not self._rebuild_aborted)
        self.aborted.truncate_from(self.log.next_offset)
        self.durable_offset = self.log.next_offset

    def _restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self.producers = ProducerStateManager()
            self.groups = GroupOffsetsView() if self.groups is not None else None
            self.aborted.truncate_from(0)
            return
        self.producers = ProducerStateManager.from_json(state.get("producers", []))
        if self.groups is not None:
            self.groups = GroupOffsetsView.from_json(state.get("groups", {}))

    def _replay(self, header: BatchHeader, segment: Segment) -> None:
        """Apply a batch read back from the log during recovery."""

        def payload() -> Any:
            return frames.payload_of(segment.read(header.position, header.frame_size), 0, header)

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
            )
        if self.groups is not None:
            self.groups.apply_records(
                payload(), header.producer_id, transactional=header.is_transactional
            )

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
        return self.durable_offset

    @property
    def last_stable_offset(self) -> int:
        first_open = self.producers.first_unstable_offset()
        hw = self.durable_offset
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
    ) -> AppendResult:
        """Validate and write one batch (not yet durable); a duplicate writes nothing."""
        count = len(rows)
        if producer_id != NO_PRODUCER_ID:
            check = self.producers.check_append(
                producer_id, producer_epoch, base_sequence, count, transactional=transactional
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
        )
        self.log.append(frame, base_offset, base_offset + count)
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
            )
        if self.groups is not None:
            self.groups.apply_records(
                [list(r) for r in rows], producer_id, transactional=transactional
            )
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
        )
        self.log.append(frame, offset, offset + 1)
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
        first = self.producers.apply_marker(producer_id, producer_epoch, coordinator_epoch, now_ms)
        if result == ABORT and first is not None:
            self.aborted.append(AbortedTxn(producer_id, first, offset))
        if self.groups is not None:
            self.groups.apply_marker(producer_id, commit=result == COMMIT)

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
        if offset < self.log_start_offset or offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.high_watermark}]"
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
