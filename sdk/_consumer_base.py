"""The consumer's logic without I/O, shared by ``Consumer`` and ``AsyncConsumer``.

A consumer reads assigned partitions from a position (the next offset to read) that it
owns. The node filters read_committed fetches itself (no aborted records, nothing past the
last stable offset, never a control record), so the client's one rule is to move its
position to the ``next_offset`` the node answers, never to the last record's offset plus
one: a fetch may skip a gap (markers, aborted batches) without returning a record.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sdk._config import ConsumerConfig
from sdk._errors import IllegalStateError
from sdk._metadata import MetadataCache
from sdk._types import ConsumerRecord, OffsetAndMetadata, Payload, TopicPartition
from sdk._types import as_topic_partition as _tp


def decode_payload(value: str | None, encoding: str) -> Payload | None:
    if value is None or encoding != "base64":
        return value
    return base64.b64decode(value)


@dataclass
class PartitionPosition:
    """A partition's next offset to read; None until it is set or looked up."""

    offset: int | None = None


class ConsumerCore:
    """Assignment, positions, request shapes and decoding. Not thread-safe."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self.metadata = MetadataCache(config.bootstrap_url)
        self.positions: dict[TopicPartition, PartitionPosition] = {}
        self._next = 0  # where the next poll starts, so no partition starves
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise IllegalStateError("the consumer is closed")

    def assign(self, partitions: list[TopicPartition] | list[tuple[str, int]]) -> None:
        wanted = [_tp(tp) for tp in partitions]
        self.positions = {tp: self.positions.get(tp, PartitionPosition()) for tp in wanted}

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def _position(self, tp: TopicPartition) -> PartitionPosition:
        try:
            return self.positions[tp]
        except KeyError:
            raise IllegalStateError(f"{tp} is not assigned to this consumer") from None

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        if offset < 0:
            raise ValueError("an offset is not negative")
        self._position(_tp(tp)).offset = offset

    def known_position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        return self._position(_tp(tp)).offset

    def unknown_positions(self) -> list[TopicPartition]:
        return [tp for tp, pos in self.positions.items() if pos.offset is None]

    def require_group(self) -> str:
        if self.config.group_id is None:
            raise IllegalStateError("this needs a consumer with a group_id")
        return self.config.group_id

    # --- positions from the group or the log ---------------------------------------------

    def reset_offset(self, offsets_body: dict[str, Any]) -> int:
        """Where a partition without a committed offset starts (``auto_offset_reset``)."""
        if self.config.auto_offset_reset == "earliest":
            return int(offsets_body["log_start_offset"])
        if self.config.isolation_level == "read_committed":
            return int(offsets_body["last_stable_offset"])
        return int(offsets_body["high_watermark"])

    @staticmethod
    def parse_committed(body: dict[str, Any]) -> dict[TopicPartition, OffsetAndMetadata]:
        return {
            TopicPartition(str(o["topic"]), int(o["partition"])): OffsetAndMetadata(
                int(o["offset"]), o.get("metadata")
            )
            for o in body.get("offsets", [])
        }

    def commit_body(
        self, offsets: dict[TopicPartition, OffsetAndMetadata] | None
    ) -> dict[str, Any]:
        if offsets is None:
            offsets = {
                tp: OffsetAndMetadata(pos.offset)
                for tp, pos in self.positions.items()
                if pos.offset is not None
            }
        return {
            "offsets": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "offset": om.offset,
                    "metadata": om.metadata,
                }
                for tp, om in sorted(offsets.items())
            ]
        }

    # --- fetching ------------------------------------------------------------------------

    def poll_order(self) -> list[TopicPartition]:
        """Assigned partitions, starting one further each poll (round robin)."""
        tps = sorted(self.positions)
        if not tps:
            return []
        start = self._next % len(tps)
        self._next += 1
        return tps[start:] + tps[:start]

    def fetch_params(self, tp: TopicPartition, max_records: int, wait_ms: int) -> dict[str, Any]:
        offset = self._position(tp).offset
        assert offset is not None
        return {
            "offset": offset,
            "max_records": max_records,
            "max_bytes": self.config.fetch_max_bytes,
            "isolation_level": self.config.isolation_level,
            "max_wait_ms": wait_ms,
        }

    def on_fetch(
        self, tp: TopicPartition, requested: int, body: dict[str, Any]
    ) -> list[ConsumerRecord]:
        """Records of a fetch answer; moves the position to ``next_offset`` (past gaps).
        An answer for a position that moved meanwhile (a seek) is dropped."""
        position = self.positions.get(tp)
        if position is None or position.offset != requested:
            return []
        records = [
            ConsumerRecord(
                tp.topic,
                tp.partition,
                int(r["offset"]),
                decode_payload(r.get("key"), r.get("encoding", "utf8")),
                decode_payload(r.get("value"), r.get("encoding", "utf8")),
                dict(r.get("headers") or {}),
                int(r["timestamp_ms"]),
            )
            for r in body["records"]
        ]
        position.offset = max(requested, int(body["next_offset"]))
        return records

    def wait_for_round(self, first: bool, remaining_ms: int, partitions: int) -> int:
        """The long-poll wait of each fetch: none on the first round (take what is
        there), then a share of what is left, so one quiet partition cannot hog it."""
        if first or partitions == 0:
            return 0
        share = min(remaining_ms, self.config.fetch_max_wait_ms) // partitions
        return max(0, share)
