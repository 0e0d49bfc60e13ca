"""The aborted-transaction index of one partition.

Each aborted transaction is one fixed entry (producer id, first offset, marker offset),
appended when the ABORT marker is written and made durable with it. A read_committed fetch
asks for the entries that overlap its range and leaves those producers' records out, as
Kafka's ``.txnindex`` does. Entries are ordered by marker offset (markers are appended in
order), and the longest span seen bounds how far past a range an overlapping entry can lie,
so a lookup never scans the whole history.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

ENTRY = struct.Struct("<qQQ")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of the ABORT marker


class AbortedTxnIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []
        self._max_span = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        # descriptors of files replaced by ``truncate_before``, closed later: the group
        # commit's fsync runs in a worker thread and may still hold one
        self._retired: list[int] = []
        self.dirty = False

    def load(self, log_end_offset: int) -> None:
        """Read the file, dropping entries whose marker lies past the recovered log end."""
        raw = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        usable = len(raw) - len(raw) % ENTRY.size
        kept = 0
        for pid, first, last in ENTRY.iter_unpack(raw[:usable]):
            if last >= log_end_offset or (self._last_offsets and last <= self._last_offsets[-1]):
                break
            self._remember(AbortedTxn(pid, first, last))
            kept += ENTRY.size
        if kept != len(raw):
            os.ftruncate(self._fd, kept)
            os.fsync(self._fd)

    def _remember(self, entry: AbortedTxn) -> None:
        self._entries.append(entry)
        self._last_offsets.append(entry.last_offset)
        self._max_span = max(self._max_span, entry.last_offset - entry.first_offset)

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry (ignored if the marker is already indexed, as on replay)."""
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            return
        self._remember(entry)
        os.write(self._fd, ENTRY.pack(entry.producer_id, entry.first_offset, entry.last_offset))
        self.dirty = True

    def fsync(self) -> None:
        if self.dirty:
            self.dirty = False
            os.fsync(self._fd)

    def truncate_from(self, offset: int) -> None:
        """Forget entries whose marker is at or after ``offset`` (the log was cut there)."""
        keep = bisect_left(self._last_offsets, offset)
        if keep == len(self._entries):
            return
        del self._entries[keep:]
        del self._last_offsets[keep:]
        os.ftruncate(self._fd, keep * ENTRY.size)
        os.fsync(self._fd)

    def truncate_before(self, offset: int) -> int:
        """Forget entries whose ABORT marker lies below ``offset`` (the log start moved
        past them: no read can reach their records); returns how many went. The file is
        written anew beside the old one and renamed over it, so a crash leaves one or the
        other whole."""
        drop = bisect_left(self._last_offsets, offset)
        if drop == 0:
            return 0
        kept = self._entries[drop:]
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join(ENTRY.pack(e.producer_id, e.first_offset, e.last_offset)
                                  for e in kept))  # fmt: skip
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        for fd in self._retired:
            os.close(fd)
        self._retired = [self._fd]
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._entries, self._last_offsets = kept, [e.last_offset for e in kept]
        self._max_span = max((e.last_offset - e.first_offset for e in kept), default=0)
        self.dirty = False
        return drop

    def overlapping(self, start: int, end: int) -> dict[int, list[tuple[int, int]]]:
        """Aborted ranges per producer that overlap offsets [start, end)."""
        found: dict[int, list[tuple[int, int]]] = {}
        i = bisect_left(self._last_offsets, start)
        limit = end + self._max_span
        while i < len(self._entries):
            entry = self._entries[i]
            if entry.last_offset > limit:
                break
            if entry.first_offset < end:
                found.setdefault(entry.producer_id, []).append(
                    (entry.first_offset, entry.last_offset)
                )
            i += 1
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        for fd in self._retired:
            os.close(fd)
        self._retired = []
        os.close(self._fd)
