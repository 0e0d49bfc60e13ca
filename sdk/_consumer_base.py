"""The consumer's logic without I/O, shared by ``Consumer`` and ``AsyncConsumer``.

A consumer reads assigned partitions from a position (the next offset to read) that it
owns. The node filters read_committed fetches itself (no aborted records, nothing past the
last stable offset, never a control record), so the client's one rule is to move its
position to the ``next_offset`` the node answers, never to the last record's offset plus
one: a fetch may skip a gap (markers, aborted batches) without returning a record.

Fetches are larger than a poll (``fetch_max_records``): an answer is kept in the
partition's buffer and handed out ``max_poll_records`` at a time, and the twins fetch the
next chunk ahead (one per partition) while the application works on the last. The
position is always the next record the *application* gets: the offset after the last
record handed out, or the answer's ``next_offset`` once its buffer is empty. A seek
empties the buffer, and an answer for an offset the partition no longer fetches from is
dropped, so nothing fetched ahead can move a position that was set meanwhile.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from eos_protocol.parsing import collector_paused
from sdk._config import ConsumerConfig
from sdk._errors import IllegalStateError
from sdk._metadata import MetadataCache
from sdk._types import ConsumerRecord, OffsetAndMetadata, Payload, TopicPartition
from sdk._types import as_topic_partition as _tp


def decode_payload(value: str | None, encoding: str) -> Payload | None:
    if value is None or encoding != "base64":
        return value
    return base64.b64decode(value)


#: Records asked for by each fetch, when ``max_poll_records`` is lower: the per-request
#: cost (HTTP, a read of the log) is then shared by ten polls' worth.
FETCH_MAX_RECORDS = 5_000
#: Fetches ahead per partition, at most. The first starts where the buffer ends; the
#: second where the first should end (its start plus the last answer's stride), so the
#: node reads one chunk while this process decodes the one before. A guess that proves
#: wrong (the answer before it ended elsewhere) is never used, only wasted.
FETCH_AHEAD = 2

_new_tuple = tuple.__new__


@dataclass
class PartitionPosition:
    """A partition's next offset for the application (None until it is set or looked
    up), and what was fetched beyond it."""

    offset: int | None = None
    buffer: list[ConsumerRecord] = field(default_factory=list)  # fetched, from ``taken`` on
    taken: int = 0
    fetched_to: int | None = None  # where the next fetch starts, past the buffer
    upper: int = 0  # the node's LSO (read_committed) or high watermark at the last answer
    stride: int = 0  # how far the last answer moved the fetch offset

    def drop_buffer(self) -> None:
        self.buffer, self.taken, self.fetched_to = [], 0, None


def decode_records(tp: TopicPartition, body: dict[str, Any]) -> list[ConsumerRecord]:
    """The records of a fetch answer. The collector is paused while they are made: the
    thousands of new objects would otherwise set off collections that walk them all
    again and again (the node parses its batches the same way)."""
    topic, partition = tp
    with collector_paused():
        out: list[ConsumerRecord] = []
        append = out.append
        for r in body["records"]:
            key, value = r["key"], r["value"]
            if r.get("encoding") == "base64":
                key, value = decode_payload(key, "base64"), decode_payload(value, "base64")
            # The fields the contract requires, as orjson gives them (ints are ints).
            append(_new_tuple(ConsumerRecord, (
                topic, partition, r["offset"], key, value, r["headers"], r["timestamp_ms"]
            )))
        return out


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
        position = self._position(_tp(tp))
        position.offset = offset
        position.drop_buffer()

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

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        """Where the partition's next fetch starts (past its buffer); None: not known."""
        position = self.positions.get(tp)
        if position is None:
            return None
        return position.offset if position.fetched_to is None else position.fetched_to

    def fetch_records(self) -> int:
        return max(self.config.max_poll_records, FETCH_MAX_RECORDS)

    def fetch_params(
        self, tp: TopicPartition, max_records: int, wait_ms: int, offset: int | None = None
    ) -> dict[str, Any]:
        """A fetch's query, from the partition's fetch offset unless ``offset`` is given
        (a fetch ahead)."""
        offset = self.fetch_offset(tp) if offset is None else offset
        assert offset is not None
        return {
            "offset": offset,
            "max_records": max_records,
            "max_bytes": self.config.fetch_max_bytes,
            "isolation_level": self.config.isolation_level,
            "max_wait_ms": wait_ms,
        }

    def has_buffered(self, tp: TopicPartition) -> bool:
        position = self.positions.get(tp)
        return position is not None and position.taken < len(position.buffer)

    def on_fetch(
        self,
        tp: TopicPartition,
        requested: int,
        body: dict[str, Any],
        records: list[ConsumerRecord] | None = None,
    ) -> bool:
        """Keep a fetch answer (its ``records`` decoded already, or decoded here) in the
        partition's buffer; ``take`` hands them out. False if it was dropped: an answer
        for an offset the partition no longer fetches from (a seek, or an assignment
        that let the partition go), or one arriving while the buffer is not empty."""
        position = self.positions.get(tp)
        if position is None or self.fetch_offset(tp) != requested or self.has_buffered(tp):
            return False
        position.buffer = decode_records(tp, body) if records is None else records
        position.taken = 0
        position.fetched_to = max(requested, int(body["next_offset"]))
        position.stride = position.fetched_to - requested
        read_committed = self.config.isolation_level == "read_committed"
        upper = body.get("last_stable_offset" if read_committed else "high_watermark")
        position.upper = int(upper) if upper is not None else 0
        if not position.buffer:
            position.offset, position.fetched_to = position.fetched_to, None
        return True

    def take(self, tp: TopicPartition, room: int) -> list[ConsumerRecord]:
        """Up to ``room`` buffered records of ``tp``; the position moves past them (past
        the whole answer's ``next_offset`` once the buffer is empty)."""
        position = self.positions.get(tp)
        if position is None or room <= 0 or position.taken >= len(position.buffer):
            return []
        start = position.taken
        end = min(len(position.buffer), start + room)
        if start == 0 and end == len(position.buffer):
            out = position.buffer
        else:
            out = position.buffer[start:end]
        position.taken = end
        if end == len(position.buffer):
            position.offset = position.fetched_to
            position.drop_buffer()
        else:
            position.offset = out[-1].offset + 1
        return out

    def ahead_offset(self, tp: TopicPartition, started: int, last: int | None) -> int | None:
        """Where the next fetch ahead of ``tp`` starts, given how many are under way
        (``started``) and the offset of the latest (``last``); None when none is worth
        making: ``FETCH_AHEAD`` are under way, or the node had nothing past that offset
        at its last answer."""
        position = self.positions.get(tp)
        offset = self.fetch_offset(tp)
        if position is None or offset is None or started >= FETCH_AHEAD:
            return None
        if last is not None:
            if position.stride <= 0:
                return None
            offset = last + position.stride
        return offset if offset < position.upper else None

    def wait_for_round(self, first: bool, remaining_ms: int, partitions: int) -> int:
        """The long-poll wait of each fetch: none on the first round (take what is
        there), then a share of what is left, so one quiet partition cannot hog it."""
        if first or partitions == 0:
            return 0
        share = min(remaining_ms, self.config.fetch_max_wait_ms) // partitions
        return max(0, share)
