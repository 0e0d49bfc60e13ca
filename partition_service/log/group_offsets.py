"""The consumer-group offsets kept in a ``__consumer_offsets`` partition.

Offsets are records of the partition (key ``[group, topic, partition]``, value
``{offset, metadata}``), so a transactional offset commit is a transactional batch: it stays
pending, invisible to readers of committed offsets, until the COMMIT marker of its producer
lands on this partition, and it vanishes on ABORT. One marker thus makes a transaction's
data and its consumed offsets visible together. This view is rebuilt from the records by
replay and saved in the partition's checkpoint.
"""

from __future__ import annotations

from typing import Any

import orjson

OffsetKey = tuple[str, int]  # (topic, partition)
OffsetValue = tuple[int, str | None]  # (offset, metadata)


def encode_offset_record(
    group_id: str, topic: str, partition: int, offset: int, metadata: str | None
) -> tuple[str, str]:
    key = orjson.dumps([group_id, topic, partition]).decode()
    value = orjson.dumps({"offset": offset, "metadata": metadata}).decode()
    return key, value


class GroupOffsetsView:
    def __init__(self) -> None:
        self.committed: dict[str, dict[OffsetKey, OffsetValue]] = {}
        # producer id -> group -> partition -> value, until that producer's marker
        self.pending: dict[int, dict[str, dict[OffsetKey, OffsetValue]]] = {}

    def apply_records(
        self, rows: list[list[Any]], producer_id: int, *, transactional: bool
    ) -> None:
        for row in rows:
            group_id, topic, partition = orjson.loads(row[0])
            value = orjson.loads(row[1])
            entry = (int(value["offset"]), value.get("metadata"))
            if transactional:
                target = self.pending.setdefault(producer_id, {}).setdefault(group_id, {})
            else:
                target = self.committed.setdefault(group_id, {})
            target[(topic, int(partition))] = entry

    def apply_marker(self, producer_id: int, *, commit: bool) -> None:
        groups = self.pending.pop(producer_id, None)
        if not groups or not commit:
            return
        for group_id, offsets in groups.items():
            self.committed.setdefault(group_id, {}).update(offsets)

    def has_pending(self, group_id: str) -> bool:
        return any(group_id in groups for groups in self.pending.values())

    def offsets(self, group_id: str) -> dict[OffsetKey, OffsetValue]:
        return dict(self.committed.get(group_id, {}))

    def to_json(self) -> dict[str, Any]:
        def flat(offsets: dict[OffsetKey, OffsetValue]) -> list[list[Any]]:
            return [[t, p, o, m] for (t, p), (o, m) in offsets.items()]

        return {
            "committed": {g: flat(o) for g, o in self.committed.items()},
            "pending": {
                str(pid): {g: flat(o) for g, o in groups.items()}
                for pid, groups in self.pending.items()
            },
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
        return view
