"""One segment: an append-only file of batch frames and its sparse offset index.

Files are named after the segment's base offset (``00000000000000001234.log`` and
``.index``) as in Kafka, so the segment holding an offset is found by a binary search over
the names alone, without opening the others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from partition_service.log import batch as frames
from partition_service.log.batch import BatchHeader, CorruptBatchError
from partition_service.log.index import OffsetIndex

READ_CHUNK = 1 << 20


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class Segment:
    """A segment file opened for reading and, if it is the active one, appending."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.base_offset = base_offset
        self.path = directory / segment_name(base_offset, ".log")
        self.index = OffsetIndex(
            directory / segment_name(base_offset, ".index"), base_offset, index_interval_bytes
        )
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.next_offset = base_offset  # set by recovery or by loading
        self._index_loaded = False
        # The newest append time of the segment's batches (retention_ms is measured from
        # it); None until known: a segment found on disk is scanned for it on first use.
        self._max_time_ms: int | None = -1 if self.size == 0 else None

    # -- writing -------------------------------------------------------------------------
    def append(self, frame: bytes, header_offset: int, append_time_ms: int | None = None) -> int:
        """Write one frame at the end; returns its position. Not yet durable."""
        position = self.size
        written = os.pwrite(self._fd, frame, position)
        if written != len(frame):
            raise OSError(f"short write to {self.path}: {written} of {len(frame)} bytes")
        self.size += written
        self.index.on_append(header_offset, position, written)
        if append_time_ms is None:
            self._max_time_ms = None  # unknown: scanned for when asked
        elif self._max_time_ms is not None:
            self._max_time_ms = max(self._max_time_ms, append_time_ms)
        return position

    def max_append_time_ms(self) -> int:
        """The newest append time of the segment's batches (-1 when it is empty): what
        retention_ms is measured from, as Kafka measures it from a segment's largest
        timestamp. Read from the batch headers once, then kept."""
        if self._max_time_ms is None:
            newest = -1
            for header in self.scan(0, verify=False):
                newest = max(newest, header.append_time_ms)
            self._max_time_ms = newest
        return self._max_time_ms

    def fsync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, position: int) -> None:
        """Cut the file at ``position`` (a batch boundary) and fix the index to match."""
        os.ftruncate(self._fd, position)
        os.fsync(self._fd)
        self.size = position
        self._max_time_ms = -1 if position == 0 else None
        self.index.truncate_to_position(position)

    def close(self) -> None:
        os.close(self._fd)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.index.path.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def ensure_index(self) -> None:
        """Load the index on first use, rebuilding it from the file when it does not fit."""
        if self._index_loaded:
            return
        if not self.index.load(self.size):
            self.index.reset()
            for header in self.scan(0, verify=False):
                self.index.on_append(header.base_offset, header.position, header.frame_size)
            self.index.flush()
        self._index_loaded = True

    def mark_index_loaded(self) -> None:
        self._index_loaded = True

    def position_for(self, offset: int) -> int:
        self.ensure_index()
        return self.index.lookup(offset)

    def scan(self, position: int, *, verify: bool) -> Iterator[BatchHeader]:
        """Headers of the frames from ``position`` to the end of the file.

        Stops with ``CorruptBatchError`` at the first frame that is torn or fails its CRC
        (with ``verify``); everything yielded before it is whole.
        """
        buffer = b""
        start = 0  # index into buffer
        file_pos = position
        while True:
            size = (
                frames.peek_size(buffer, start)
                if len(buffer) - start >= frames.PREFIX_SIZE
                else None
            )
            if size is None or len(buffer) - start < size:
                want = max(READ_CHUNK, size or 0)
                more = self.read(file_pos + (len(buffer) - start), want)
                if not more:
                    if len(buffer) - start > 0:
                        raise CorruptBatchError(f"torn frame at position {file_pos}")
                    return
                buffer = buffer[start:] + more
                start = 0
                continue
            header = frames.decode_header(buffer, start, file_pos, verify=verify)
            yield header
            start += size
            file_pos += size

    def read_frames(self, position: int, max_bytes: int) -> tuple[bytes, int]:
        """At least one whole frame (if any) from ``position``; returns (bytes, start)."""
        data = self.read(position, max(max_bytes, READ_CHUNK))
        if len(data) >= frames.PREFIX_SIZE:
            size = frames.peek_size(data, 0)
            if size is not None and size > len(data):
                data += self.read(position + len(data), size - len(data))
        return data, position
