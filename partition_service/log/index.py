"""The sparse offset index of one segment.

One entry (relative offset u32, file position u32) is added whenever more than
``interval_bytes`` were appended since the last entry, so a fetch finds its starting batch
with a binary search and a short forward scan, whatever the length of the log. The index
is a cache of the segment: it is flushed at checkpoints and rebuilt from the segment when
it is missing or does not fit it.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from pathlib import Path

ENTRY = struct.Struct("<II")


class OffsetIndex:
    """Entries in memory (two ``array``s) mirrored to an append-only file."""

    def __init__(self, path: Path, base_offset: int, interval_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.interval_bytes = interval_bytes
        self._relative = array("I")
        self._positions = array("I")
        self._unflushed = bytearray()
        self._bytes_since_entry = 0

    # -- loading -------------------------------------------------------------------------
    def load(self, segment_size: int) -> bool:
        """Read the index file; False when it is missing or does not fit the segment."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        usable = len(raw) - len(raw) % ENTRY.size
        relative, positions = array("I"), array("I")
        last_rel, last_pos = -1, -1
        for rel, pos in ENTRY.iter_unpack(raw[:usable]):
            if rel <= last_rel or pos <= last_pos or pos >= segment_size:
                return False
            relative.append(rel)
            positions.append(pos)
            last_rel, last_pos = rel, pos
        self._relative, self._positions = relative, positions
        return True

    def reset(self) -> None:
        """Forget every entry (before a rebuild)."""
        self._relative = array("I")
        self._positions = array("I")
        self._unflushed.clear()
        self._bytes_since_entry = 0
        self.path.write_bytes(b"")

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or past ``position`` (the segment was cut there)."""
        keep = bisect_right(self._positions, position - 1) if position > 0 else 0
        if keep == len(self._positions):
            return
        del self._relative[keep:]
        del self._positions[keep:]
        self._unflushed.clear()
        with open(self.path, "wb") as out:
            for rel, pos in zip(self._relative, self._positions, strict=True):
                out.write(ENTRY.pack(rel, pos))
        self._bytes_since_entry = self.interval_bytes  # next batch gets an entry

    # -- appending -----------------------------------------------------------------------
    def on_append(self, offset: int, position: int, size: int) -> None:
        """Record a batch appended at ``position``; adds an entry when the interval is due."""
        if not self._positions or self._bytes_since_entry >= self.interval_bytes:
            rel = offset - self.base_offset
            if self._relative and rel <= self._relative[-1]:
                return
            self._relative.append(rel)
            self._positions.append(position)
            self._unflushed += ENTRY.pack(rel, position)
            self._bytes_since_entry = 0
        self._bytes_since_entry += size

    def flush(self) -> None:
        """Write pending entries and make them durable."""
        if not self._unflushed:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, bytes(self._unflushed))
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unflushed.clear()

    # -- lookup --------------------------------------------------------------------------
    def lookup(self, offset: int) -> int:
        """File position of the last indexed batch starting at or before ``offset``."""
        i = bisect_right(self._relative, offset - self.base_offset) - 1
        return self._positions[i] if i >= 0 else 0

    def __len__(self) -> int:
        return len(self._positions)
