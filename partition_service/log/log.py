"""The log of one partition: its segments, recovery after a crash, and checkpoints.

Recovery follows Kafka's: a checkpoint records a position up to which the log is known to
be whole (together with the partition state at that offset), so a restart scans only what
was written after it, however long the log is. Scanning verifies every frame's CRC and its
offset; the first torn or corrupt frame and everything after it is cut off, never served.
A checkpoint that does not fit the files any more (a segment cut short, say) is ignored and
the log is scanned from its start, which is slow but always correct.
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from partition_service.log.batch import BatchHeader, CorruptBatchError
from partition_service.log.segment import Segment

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1
#: The log start offset when it lies above the first segment's base (Kafka's
#: log-start-offset-checkpoint): a follower told a leader's log start inside a segment.
LOG_START_FILE = "log-start-offset"


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 64 * 1024 * 1024
    index_interval_bytes: int = 4096
    # Kafka's producer.id.expiration.ms: idle producers with nothing open are forgotten
    producer_expiration_ms: int = 86_400_000


@dataclass(frozen=True)
class Checkpoint:
    """A consistent cut: the log up to ``next_offset`` (at ``segment``/``position``) and the
    partition state after applying exactly those batches."""

    next_offset: int
    segment: int
    position: int
    segment_sizes: dict[int, int]
    state: dict[str, Any]


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Log:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.next_offset = 0
        self.log_start_offset = 0
        self.recovered_batches = 0  # how many frames the last open() had to scan

    # -- opening and recovery ------------------------------------------------------------
    def open(
        self,
        restore: Callable[[dict[str, Any] | None], None],
        replay: Callable[[BatchHeader, Segment], None],
        *,
        use_checkpoint: bool = True,
    ) -> None:
        """Open the segments, repair the tail and replay what follows the checkpoint.

        ``restore`` first gets the checkpointed partition state (None: start empty, the
        whole log will be replayed); then ``replay`` is called for every batch after it.
        ``use_checkpoint=False`` replays the whole log, for state the checkpoint cannot
        bring back.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log"))
        if not bases:
            bases = [0]
        for base in bases:
            self._add_segment(Segment(self.directory, base, self.config.index_interval_bytes))
        self.log_start_offset = self.segments[0].base_offset

        checkpoint = self._usable_checkpoint() if use_checkpoint else None
        if checkpoint is None:
            seg_index, position, self.next_offset = 0, 0, self.segments[0].base_offset
            restore(None)
        else:
            seg_index = self._bases.index(checkpoint.segment)
            position, self.next_offset = checkpoint.position, checkpoint.next_offset
            restore(checkpoint.state)
            active = self.segments[seg_index]
            active.ensure_index()
            active.index.truncate_to_position(position)
        self._scan_from(seg_index, position, replay)
        for i, segment in enumerate(self.segments[:-1]):
            segment.next_offset = self._bases[i + 1]
        self.active.next_offset = self.next_offset
        self.log_start_offset = self.segments[0].base_offset
        persisted = read_log_start(self.directory)
        if persisted is not None and self.log_start_offset < persisted <= self.next_offset:
            self.log_start_offset = persisted

    def _usable_checkpoint(self) -> Checkpoint | None:
        checkpoint = read_checkpoint(self.directory)
        if checkpoint is None or checkpoint.segment not in self._bases:
            return None
        for segment in self.segments:
            expected = checkpoint.segment_sizes.get(segment.base_offset)
            if segment.base_offset < checkpoint.segment and expected != segment.size:
                return None  # a closed segment changed since: trust nothing
            if segment.base_offset == checkpoint.segment and segment.size < checkpoint.position:
                return None
        return checkpoint

    def _scan_from(
        self, seg_index: int, position: int, replay: Callable[[BatchHeader, Segment], None]
    ) -> None:
        self.recovered_batches = 0
        for i in range(seg_index, len(self.segments)):
            segment = self.segments[i]
            start = position if i == seg_index else 0
            if i != seg_index or start == 0:
                segment.index.reset()
                segment.mark_index_loaded()
            if start == 0 and segment.base_offset != self.next_offset and segment.size > 0:
                self._cut(i, 0)  # a segment that does not continue the log
                return
            good = start
            try:
                for header in segment.scan(start, verify=True):
                    if header.base_offset != self.next_offset:
                        raise CorruptBatchError(
                            f"offset {header.base_offset} where {self.next_offset} was expected"
                        )
                    if i != seg_index or header.position >= position:
                        segment.index.on_append(
                            header.base_offset, header.position, header.frame_size
                        )
                    replay(header, segment)
                    self.next_offset = header.next_offset
                    good = header.position + header.frame_size
                    self.recovered_batches += 1
            except CorruptBatchError:
                self._cut(i, good)
                return
            segment.index.flush()

    def _cut(self, seg_index: int, position: int) -> None:
        """Truncate segment ``seg_index`` at ``position`` and delete every later segment."""
        for segment in self.segments[seg_index + 1 :]:
            segment.delete()
        del self.segments[seg_index + 1 :]
        del self._bases[seg_index + 1 :]
        self.segments[seg_index].truncate(position)
        self.segments[seg_index].index.flush()
        fsync_directory(self.directory)

    def _add_segment(self, segment: Segment) -> None:
        self.segments.append(segment)
        self._bases.append(segment.base_offset)

    # -- appending -----------------------------------------------------------------------
    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def append(
        self, frame: bytes, base_offset: int, next_offset: int, append_time_ms: int | None = None
    ) -> None:
        """Write a frame whose offsets are [base_offset, next_offset). Not yet durable."""
        if base_offset != self.next_offset:
            raise ValueError(f"append at {base_offset}, log end is {self.next_offset}")
        if self.active.size > 0 and self.active.size + len(frame) > self.config.segment_bytes:
            self.roll()
        self.active.append(frame, base_offset, append_time_ms)
        self.next_offset = next_offset
        self.active.next_offset = next_offset

    def truncate_to(self, offset: int) -> None:
        """Cut the log at ``offset``, which must be where a batch starts (or the log end):
        the segments after it are deleted and the log ends there, durably."""
        if offset >= self.next_offset:
            return
        seg_index = self.segment_for(offset)
        segment = self.segments[seg_index]
        position = segment.position_for(offset) if offset > segment.base_offset else 0
        if offset > segment.base_offset:
            for header in segment.scan(position, verify=False):
                if header.base_offset >= offset:
                    if header.base_offset != offset:
                        raise ValueError(f"offset {offset} is not where a batch starts")
                    position = header.position
                    break
            else:
                raise ValueError(f"offset {offset} is not in segment {segment.base_offset}")
        self._cut(seg_index, position)
        self.next_offset = offset
        self.active.next_offset = offset

    def roll(self) -> None:
        """Close the active segment (durably, with its index) and start a new one."""
        old = self.active
        old.fsync()
        old.index.flush()
        segment = Segment(self.directory, self.next_offset, self.config.index_interval_bytes)
        segment.mark_index_loaded()
        segment.next_offset = self.next_offset
        self._add_segment(segment)
        fsync_directory(self.directory)

    def fsync(self) -> None:
        self.active.fsync()

    # -- the log start -------------------------------------------------------------------
    def segment_end(self, index: int) -> int:
        """The offset after segment ``index`` (the next segment's base, or the log end)."""
        return self._bases[index + 1] if index + 1 < len(self._bases) else self.next_offset

    def advance_start(self, offset: int) -> list[tuple[int, int]]:
        """Move the log start up to ``offset`` (at most the log end) and delete every
        closed segment wholly below it, never the active one; returns the (base offset,
        size) of each deleted segment. The new start is written durably before any file
        goes, so a crash between the two leaves the files a restart deletes no reader can
        reach."""
        offset = min(offset, self.next_offset)
        if offset <= self.log_start_offset:
            return []
        write_log_start(self.directory, offset)
        self.log_start_offset = offset
        deleted: list[tuple[int, int]] = []
        while len(self.segments) > 1 and self._bases[1] <= offset:
            segment = self.segments.pop(0)
            self._bases.pop(0)
            deleted.append((segment.base_offset, segment.size))
            segment.delete()
        if deleted:
            fsync_directory(self.directory)
        return deleted

    def restart_at(self, offset: int) -> None:
        """Delete every segment and begin the log empty at ``offset`` (a follower whose
        log ends below its leader's log start: Kafka's truncateFullyAndStartAt)."""
        for segment in self.segments:
            segment.delete()
        self.segments, self._bases = [], []
        write_log_start(self.directory, offset)
        segment = Segment(self.directory, offset, self.config.index_interval_bytes)
        segment.mark_index_loaded()
        self._add_segment(segment)
        self.next_offset = self.log_start_offset = offset
        fsync_directory(self.directory)

    # -- reading -------------------------------------------------------------------------
    def segment_for(self, offset: int) -> int:
        return max(bisect_right(self._bases, offset) - 1, 0)

    def batches_from(self, offset: int) -> Iterator[tuple[BatchHeader, memoryview, int]]:
        """Batches that end at or after ``offset``, in order: (header, buffer, start).

        ``buffer[start:start + header.frame_size]`` is the frame. Reads in large chunks so
        a fetch costs one or two reads, wherever the offset lies in the log.
        """
        from partition_service.log import batch as frames

        seg_index = self.segment_for(offset)
        for segment in self.segments[seg_index:]:
            position = segment.position_for(offset) if segment.base_offset <= offset else 0
            end = segment.size
            while position < end:
                data, _ = segment.read_frames(position, 1 << 20)
                view = memoryview(data)
                start = 0
                while start < len(view):
                    size = frames.peek_size(view, start)
                    if size is None or start + size > len(view):
                        break
                    header = frames.decode_header(view, start, position + start, verify=False)
                    if header.last_offset >= offset:
                        yield header, view, start
                    start += size
                if start == 0:
                    raise CorruptBatchError(f"unreadable frame at {segment.path}:{position}")
                position += start

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint_point(self) -> tuple[int, int, int, dict[int, int]]:
        """(next_offset, active segment, position, sizes of closed segments) right now."""
        sizes = {s.base_offset: s.size for s in self.segments[:-1]}
        return self.next_offset, self.active.base_offset, self.active.size, sizes

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Write the checkpoint atomically; the caller ensures the log is durable up to it."""
        for segment in self.segments:
            segment.index.flush()
        body = orjson.dumps(
            {
                "version": CHECKPOINT_VERSION,
                "next_offset": checkpoint.next_offset,
                "segment": checkpoint.segment,
                "position": checkpoint.position,
                "segment_sizes": {str(k): v for k, v in checkpoint.segment_sizes.items()},
                "state": checkpoint.state,
            }
        )
        data = body + b"\n" + str(zlib.crc32(body)).encode()
        tmp = self.directory / (CHECKPOINT_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / CHECKPOINT_FILE)
        fsync_directory(self.directory)

    def close(self) -> None:
        for segment in self.segments:
            segment.close()


def write_log_start(directory: Path, offset: int) -> None:
    """Persist the log start offset atomically (temporary file, fsync, rename)."""
    tmp = directory / (LOG_START_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, str(offset).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / LOG_START_FILE)
    fsync_directory(directory)


def read_log_start(directory: Path) -> int | None:
    try:
        return int((directory / LOG_START_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint file, or None if it is missing, torn or corrupt."""
    try:
        raw = (directory / CHECKPOINT_FILE).read_bytes()
        body, _, crc = raw.rpartition(b"\n")
        if not body or zlib.crc32(body) != int(crc):
            return None
        data = orjson.loads(body)
        if data.get("version") != CHECKPOINT_VERSION:
            return None
        return Checkpoint(
            next_offset=int(data["next_offset"]),
            segment=int(data["segment"]),
            position=int(data["position"]),
            segment_sizes={int(k): int(v) for k, v in data["segment_sizes"].items()},
            state=data["state"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
