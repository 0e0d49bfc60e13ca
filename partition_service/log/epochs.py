"""Which leader epoch wrote which offsets of a partition: Kafka's leader-epoch cache.

Each entry says "epoch E began at offset O": the first offset the leader of epoch E
appended. Two replicas that agree on an epoch's entries agree on the batches it wrote, so
after a leader change a follower asks the new leader where the follower's last epoch ended
there (``end_offset_for``) and cuts its own log at that offset. It never cuts at its high
watermark alone, because that can lose acknowledged records or keep divergent ones
(KIP-101, KIP-279).

The entries live in ``leader-epoch-checkpoint`` beside the segments: one ``epoch offset``
line per entry and a CRC line, replaced atomically on every change. Changes are rare (one
per leader change or truncation). The cache can always be rebuilt from the batches
themselves, since every frame carries its leader epoch.
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_right
from itertools import pairwise
from pathlib import Path

from partition_service.log.log import fsync_directory

EPOCH_FILE = "leader-epoch-checkpoint"
UNDEFINED = -1  # Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET


class StaleEpochError(ValueError):
    """An epoch older than the newest one was assigned: a deposed leader's write."""


class LeaderEpochCache:
    """Epoch start offsets of one partition, newest last."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / EPOCH_FILE
        self.entries: list[tuple[int, int]] = []  # (epoch, start offset), both increasing

    # -- the file ------------------------------------------------------------------------
    def load(self) -> bool:
        """Read the file; False (and no entries) when it is missing or damaged, in which
        case the log must be replayed from its start to rebuild the entries."""
        self.entries = []
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        body, _, crc = raw.rpartition(b"\n")
        try:
            if zlib.crc32(body) != int(crc):
                return False
            entries = [tuple(map(int, line.split())) for line in body.decode().splitlines()]
        except ValueError:
            return False
        if any(len(e) != 2 for e in entries):
            return False
        pairs = [(e[0], e[1]) for e in entries]
        if not _increasing(pairs):
            return False
        self.entries = pairs
        return True

    def _write(self) -> None:
        body = "".join(f"{epoch} {offset}\n" for epoch, offset in self.entries).encode()
        tmp = self.path.with_name(EPOCH_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body + b"\n" + str(zlib.crc32(body)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)

    # -- reading -------------------------------------------------------------------------
    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def epoch_at(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (UNDEFINED before the first entry)."""
        i = bisect_right([start for _, start in self.entries], offset) - 1
        return self.entries[i][0] if i >= 0 else UNDEFINED

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch`` known here, the offset where it ended): Kafka's
        OffsetsForLeaderEpoch answer. The newest epoch ends at the log end; an epoch newer
        than any here, or none at all, is (UNDEFINED, UNDEFINED). An epoch older than the
        first entry ends where the first entry starts."""
        if epoch == UNDEFINED or not self.entries:
            return UNDEFINED, UNDEFINED
        if epoch >= self.latest_epoch:
            return (self.latest_epoch, log_end_offset) if epoch == self.latest_epoch else (
                UNDEFINED,
                UNDEFINED,
            )
        epochs = [e for e, _ in self.entries]
        later = bisect_right(epochs, epoch)  # the first entry with an epoch above ``epoch``
        floor = epochs[later - 1] if later > 0 else epoch
        return floor, self.entries[later][1]

    # -- changes -------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` begins at ``start_offset`` unless it is already known;
        True if the file changed. An older epoch than the newest is refused."""
        if self.entries and epoch == self.latest_epoch:
            return False
        if self.entries and epoch < self.latest_epoch:
            raise StaleEpochError(f"epoch {epoch} is older than {self.latest_epoch}")
        # A newer epoch starting where the last one started replaces it: that epoch wrote
        # nothing (Kafka drops entries that a newer one makes empty in the same way).
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        self._write()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: forget epochs that began at or after it."""
        keep = [(e, o) for e, o in self.entries if o < end_offset]
        if keep != self.entries:
            self.entries = keep
            self._write()

    def clear(self) -> None:
        if self.entries or self.path.exists():
            self.entries = []
            self._write()


def _increasing(entries: list[tuple[int, int]]) -> bool:
    return all(a[0] < b[0] and a[1] < b[1] for a, b in pairwise(entries))
