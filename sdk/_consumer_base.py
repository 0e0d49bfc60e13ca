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

The partitions are read with one request per node (``POST /v1/fetch``, Kafka's Fetch):
each round of a poll groups the partitions that need records, and those worth fetching
ahead, by their leader, and names each at its own offset. A partition's error in an
answer is handled as a failed request for it alone would be (``on_fetch_error``): stale
metadata is looked up again and the partition tried after a backoff, an offset out of
range is reset, anything else reaches the application. A node of an earlier release has
no such endpoint (404): its partitions are read one request each, as before, and the node
is asked the new way again after ``OLDER_NODE_RECHECK_S``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eos_protocol.fetch_many import DEFAULT_FETCH_MAX_BYTES
from eos_protocol.parsing import collector_paused
from sdk._config import ConsumerConfig
from sdk._errors import EosTimeoutError, IllegalStateError
from sdk._metadata import MetadataCache
from sdk._transport import (
    POLICIES,
    UNKNOWN_OUTCOME,
    Req,
    Verdict,
    backoff_s,
    classify,
    error_from_body,
)
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
#: The storage nodes' multi-partition fetch.
FETCH_MANY_PATH = "/v1/fetch"
#: The most bytes one request to a node may bring back (Kafka's ``fetch.max.bytes``);
#: each partition's share is ``fetch_max_bytes``.
FETCH_TOTAL_MAX_BYTES = DEFAULT_FETCH_MAX_BYTES
#: How long a node that has no ``POST /v1/fetch`` is read one partition per request
#: before it is asked again (it may have been upgraded meanwhile).
OLDER_NODE_RECHECK_S = 60.0
#: How long a partition may keep failing (its leader unknown, its node down) before the
#: poll raises the error: a request's deadline, as when it was fetched on its own.
FETCH_ERROR_TIMEOUT_S = 30.0

_new_tuple = tuple.__new__
_FETCH_POLICY = POLICIES[Req.FETCH]


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
    retry_at: float = 0.0  # after a failed fetch: not fetched again before (monotonic)
    failures: int = 0  # fetches failed in a row
    failing_since: float | None = None  # when the first of them failed

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


@dataclass
class NodeAnswer:
    """What one request for records gave, partition by partition: made by the request's
    task or thread, read by the polling one. ``older``: the node has no multi-partition
    fetch (an earlier release); nothing was read."""

    url: str
    fetched: dict[TopicPartition, tuple[dict[str, Any], list[ConsumerRecord]]] = field(
        default_factory=dict
    )
    errors: dict[TopicPartition, BaseException] = field(default_factory=dict)
    older: bool = False

    def failed(self, tps: list[TopicPartition], exc: BaseException) -> NodeAnswer:
        """The request as a whole failed: each of its partitions failed with ``exc``."""
        for tp in tps:
            self.errors[tp] = exc
        return self

    def read(self, body: dict[str, Any]) -> NodeAnswer:
        """Take in a ``POST /v1/fetch`` answer: each entry's records decoded (its offsets
        are the one-partition answer's), or its error as the exception of its code."""
        for entry in body["partitions"]:
            tp = TopicPartition(str(entry["topic"]), int(entry["partition"]))
            error = entry.get("error")
            if error is not None:
                self.errors[tp] = error_from_body(error)
            else:
                self.fetched[tp] = (entry, decode_records(tp, entry))
        return self


class ConsumerCore:
    """Assignment, positions, request shapes and decoding. Not thread-safe."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self.metadata = MetadataCache(config.bootstrap_url)
        self.positions: dict[TopicPartition, PartitionPosition] = {}
        self._next = 0  # where the next poll starts, so no partition starves
        self._older: dict[str, float] = {}  # node URL -> read per partition until then
        self.closed = False
        #: The partitions come from the group (``subscribe``), not from ``assign``.
        self.subscribed = False

    def check_open(self) -> None:
        if self.closed:
            raise IllegalStateError("the consumer is closed")

    def assign(self, partitions: list[TopicPartition] | list[tuple[str, int]]) -> None:
        if self.subscribed:
            raise IllegalStateError(
                "assign() and subscribe() exclude each other: this consumer is subscribed "
                "(call unsubscribe() first)"
            )
        wanted = [_tp(tp) for tp in partitions]
        self.positions = {tp: self.positions.get(tp, PartitionPosition()) for tp in wanted}

    def check_can_subscribe(self) -> None:
        """A group id is needed, and no partitions assigned by hand (Kafka's rule)."""
        self.require_group()
        if not self.subscribed and self.positions:
            raise IllegalStateError(
                "assign() and subscribe() exclude each other: this consumer has partitions "
                "assigned by hand (call unsubscribe() or assign([]) first)"
            )

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """The group gave these partitions: read them from positions yet to be found."""
        for tp in partitions:
            self.positions.setdefault(tp, PartitionPosition())

    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Let go of these partitions: their positions and buffered records are dropped."""
        for tp in partitions:
            self.positions.pop(tp, None)

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

    def fetch_many_body(self, entries: list[tuple[TopicPartition, int]], wait_ms: int
                        ) -> dict[str, Any]:
        """A ``POST /v1/fetch`` body naming each partition of ``entries`` at its offset,
        with the one-partition fetch's limits."""
        max_records = self.fetch_records()
        partition_bytes = self.config.fetch_max_bytes
        return {
            "isolation_level": self.config.isolation_level,
            "max_wait_ms": wait_ms, "min_bytes": 1, "max_bytes": FETCH_TOTAL_MAX_BYTES,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "offset": offset,
                 "max_records": max_records, "max_bytes": partition_bytes}
                for tp, offset in entries
            ],
        }  # fmt: skip

    def attempt_s(self, wait_ms: int) -> float:
        """How long one request for records may take: its long poll, plus the time a node
        takes to answer from memory (``coordinator_timeout_ms``). A leader that stays
        silent past that is paused or cut off: the fetch fails, the leaders are looked
        up again, and the next one goes to whichever leader the cluster elected."""
        return self.config.retry.coordinator_timeout_ms / 1000 + wait_ms / 1000

    def wanted(
        self, tp: TopicPartition, now: float, *, started: int, last: int | None, pending: bool
    ) -> int | None:
        """The offset this round's request to ``tp``'s node names for it, or None: its
        fetch offset when it has no records buffered and no fetch from there under way
        (``pending``), else where a fetch ahead would start; nothing while a failure's
        backoff runs or before its position is known."""
        position = self.positions.get(tp)
        if position is None or position.offset is None or position.retry_at > now:
            return None
        if not self.has_buffered(tp) and not pending:
            return self.fetch_offset(tp)
        return self.ahead_offset(tp, started, last)

    def needs_records(self, tp: TopicPartition) -> bool:
        """Assigned, at a known position, with nothing buffered."""
        position = self.positions.get(tp)
        return position is not None and position.offset is not None and (
            position.taken >= len(position.buffer)
        )

    def on_fetch_error(self, tp: TopicPartition, exc: BaseException, now: float) -> bool:
        """A fetch of ``tp`` failed with ``exc`` (an entry's error, or its request's): try
        it again after a backoff, as the transport retries a request; True when the
        topic's leaders should be looked up again first. Raises ``exc`` when no retry
        would help, or when the partition has failed for ``FETCH_ERROR_TIMEOUT_S``."""
        position = self.positions.get(tp)
        verdict = classify(_FETCH_POLICY, exc)
        if position is None:
            return False
        if position.failing_since is None:
            position.failing_since = now
        if verdict is Verdict.FAIL:
            raise exc
        if now - position.failing_since >= FETCH_ERROR_TIMEOUT_S:
            if isinstance(exc, UNKNOWN_OUTCOME):
                raise EosTimeoutError(f"fetch: no answer before the deadline ({exc!r})") from exc
            raise exc
        position.failures += 1
        position.retry_at = now + backoff_s(exc, position.failures, self.config.retry)
        return verdict is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME)

    def next_retry(self, now: float) -> float | None:
        """The soonest a partition's backoff ends, if one runs."""
        waits = [p.retry_at for p in self.positions.values() if p.retry_at > now]
        return min(waits) if waits else None

    def is_older(self, url: str, now: float) -> bool:
        """Whether the node at ``url`` is read one partition per request now."""
        return self._older.get(url, 0.0) > now

    def mark_older(self, url: str, now: float) -> None:
        self._older[url] = now + OLDER_NODE_RECHECK_S

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
        position.failures, position.failing_since = 0, None
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

    def wait_for_round(self, first: bool, remaining_ms: int) -> int:
        """The long-poll wait of a round's requests: none on the first round (take what
        is there), then what is left of the poll, up to ``fetch_max_wait_ms``. The nodes'
        requests run side by side, so each may wait it all."""
        if first:
            return 0
        return max(0, min(remaining_ms, self.config.fetch_max_wait_ms))
