"""The consumer-group offsets kept in a ``__consumer_offsets`` partition.

Offsets are records of the partition (key ``[group, topic, partition]``, value
``{offset, metadata}``; a null value is a tombstone, written when the topic is deleted),
so a transactional offset commit is a transactional batch: it stays pending, invisible to
readers of committed offsets, until the COMMIT marker of its producer lands on this
partition, and it vanishes on ABORT. One marker thus makes a transaction's data and its
consumed offsets visible together. This view is rebuilt from the records by
replay and saved in the partition's checkpoint.

For compaction (``partition_service.log.cleaner``) the view also knows where the record
holding each committed value lies (``written_at``): a segment none of whose offsets holds
a current value, and below the LSO (so no pending commit lies in it), can go.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import orjson

log = logging.getLogger("eos.node.group_offsets")

OffsetKey = tuple[str, int]  # (topic, partition)
OffsetValue = tuple[int, str | None]  # (offset, metadata)
RecordKey = tuple[str, str, int]  # (group, topic, partition)
#: Where a value read from a checkpoint without positions lies: not known, so below any
#: segment (compaction copies it forward once, which is always safe).
UNKNOWN_POSITION = -1


def encode_offset_key(group_id: str, topic: str, partition: int) -> str:
    """The record key of a group's offset of one partition; with a null value, the
    tombstone that removes it (the offsets of a deleted topic)."""
    return orjson.dumps([group_id, topic, partition]).decode()


def encode_offset_record(
    group_id: str, topic: str, partition: int, offset: int, metadata: str | None
) -> tuple[str, str]:
    key = encode_offset_key(group_id, topic, partition)
    value = orjson.dumps({"offset": offset, "metadata": metadata}).decode()
    return key, value


class GroupOffsetsView:
    def __init__(self) -> None:
        self.committed: dict[str, dict[OffsetKey, OffsetValue]] = {}
        # producer id -> group -> partition -> value, until that producer's marker
        self.pending: dict[int, dict[str, dict[OffsetKey, OffsetValue]]] = {}
        # the log offset of the record holding each committed value (and each pending one)
        self.written_at: dict[RecordKey, int] = {}
        self.pending_at: dict[int, dict[RecordKey, int]] = {}

    def apply_records(
        self,
        rows: list[list[Any]],
        producer_id: int,
        *,
        transactional: bool,
        base_offset: int = UNKNOWN_POSITION,
    ) -> None:
        for i, row in enumerate(rows):
            try:
                group_id, topic, partition = orjson.loads(row[0])
                key = (str(group_id), str(topic), int(partition))
                value = None if row[1] is None else orjson.loads(row[1])
                entry = None if value is None else (int(value["offset"]), value.get("metadata"))
            except (ValueError, TypeError, KeyError) as exc:
                # not an offset (written by a release that let clients produce here): a
                # replay must go on past it, and nothing reads it as an offset
                log.warning("an unreadable record in the group offsets skipped: %s", exc)
                continue
            if entry is None:  # a tombstone: only written outside transactions
                if not transactional:
                    self._forget(key)
                continue
            at = base_offset + i if base_offset >= 0 else UNKNOWN_POSITION
            if transactional:
                target = self.pending.setdefault(producer_id, {}).setdefault(key[0], {})
                self.pending_at.setdefault(producer_id, {})[key] = at
            else:
                target = self.committed.setdefault(key[0], {})
                self.written_at[key] = at
            target[(key[1], key[2])] = entry

    def _forget(self, key: RecordKey) -> None:
        group_id, topic, partition = key
        offsets = self.committed.get(group_id)
        if offsets is not None:
            offsets.pop((topic, partition), None)
            if not offsets:
                del self.committed[group_id]
        self.written_at.pop(key, None)

    def keys_of_topics(self, topics: Collection[str]) -> list[RecordKey]:
        """The committed offsets of these topics, each as its record key: what a topic's
        deletion removes (Kafka's group coordinator drops the offsets of deleted
        partitions, so that a topic made again under the name starts with none)."""
        return [
            (group_id, topic, partition)
            for group_id, offsets in self.committed.items()
            for topic, partition in offsets
            if topic in topics
        ]

    def apply_marker(self, producer_id: int, *, commit: bool) -> None:
        groups = self.pending.pop(producer_id, None)
        positions = self.pending_at.pop(producer_id, {})
        if not groups or not commit:
            return
        for group_id, offsets in groups.items():
            self.committed.setdefault(group_id, {}).update(offsets)
        self.written_at.update(positions)

    def live_below(self, offset: int) -> list[tuple[RecordKey, OffsetValue]]:
        """Committed values whose record lies below ``offset``: what compaction must copy
        forward before the segments below ``offset`` can go."""
        return [
            (key, self.committed[key[0]][(key[1], key[2])])
            for key, at in self.written_at.items()
            if at < offset
        ] + [
            ((group, topic, partition), value)
            for group, offsets in self.committed.items()
            for (topic, partition), value in offsets.items()
            if (group, topic, partition) not in self.written_at
        ]

    def has_pending(self, group_id: str) -> bool:
        return any(group_id in groups for groups in self.pending.values())

    def offsets(self, group_id: str) -> dict[OffsetKey, OffsetValue]:
        return dict(self.committed.get(group_id, {}))

    def to_json(self) -> dict[str, Any]:
        def flat(offsets: dict[OffsetKey, OffsetValue]) -> list[list[Any]]:
            return [[t, p, o, m] for (t, p), (o, m) in offsets.items()]

        def places(positions: dict[RecordKey, int]) -> list[list[Any]]:
            return [[g, t, p, at] for (g, t, p), at in positions.items()]

        return {
            "committed": {g: flat(o) for g, o in self.committed.items()},
            "pending": {
                str(pid): {g: flat(o) for g, o in groups.items()}
                for pid, groups in self.pending.items()
            },
            "written_at": places(self.written_at),
            "pending_at": {str(pid): places(at) for pid, at in self.pending_at.items()},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GroupOffsetsView:
        def unflat(rows: list[list[Any]]) -> dict[OffsetKey, OffsetValue]:
            return {(t, int(p)): (int(o), m) for t, p, o, m in rows}

        view = cls()
        view.committed = {g: unflat(rows) for g, rows in raw.get("committed", {}).items()}
        view.pending = {
            int(pid): {g: unflat(rows) for g, rows in groups.items()}
            for pid, groups in raw.get("pending", {}).items()
        }

        def unplace(rows: list[list[Any]]) -> dict[RecordKey, int]:
            return {(str(g), str(t), int(p)): int(at) for g, t, p, at in rows}

        view.written_at = unplace(raw.get("written_at", []))
        view.pending_at = {int(pid): unplace(r) for pid, r in raw.get("pending_at", {}).items()}
        return view
