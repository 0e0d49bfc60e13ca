"""A topic's retention: chosen at creation, stored with the topic, changed by an alter.

Kafka keeps ``retention.ms`` and ``retention.bytes`` per topic with cluster defaults; so
does EOS, in ``topics.retention_ms``/``retention_bytes`` (migration 0006). -1 is
unlimited. The storage nodes learn a partition's retention with its assignment
(``PartitionState``, in every heartbeat answer and state push), so a change made here
reaches every replica within a heartbeat, and the leader's deletions decide the log start
offset that the followers follow.

``__consumer_offsets`` takes no retention: it is compacted (the latest committed offset
of each group and partition kept), never cut by age or size, so an alter of it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.db.schema import topics
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.coordinator import UNLIMITED_RETENTION
from eos_protocol.errors import InvalidRequestError, UnknownTopicOrPartitionError


@dataclass(frozen=True)
class TopicRetention:
    """How long (``ms``) and how much (``bytes``, per partition) a topic keeps; -1 each
    for unlimited."""

    ms: int = UNLIMITED_RETENTION
    bytes: int = UNLIMITED_RETENTION

    def __post_init__(self) -> None:
        for name, value in (("retention_ms", self.ms), ("retention_bytes", self.bytes)):
            if value < UNLIMITED_RETENTION:
                raise InvalidRequestError(f"{name} must be -1 (unlimited) or more, not {value}")

    def with_defaults(self, ms: int | None, size: int | None) -> TopicRetention:
        """This retention with ``ms``/``size`` replacing its fields where they are given
        (a creation over the defaults, an alter over the stored values)."""
        return TopicRetention(self.ms if ms is None else ms, self.bytes if size is None else size)


UNLIMITED = TopicRetention()


def check_alterable(name: str, ms: int | None, size: int | None) -> None:
    """``INVALID_REQUEST`` for an alter that names nothing, or names the compacted
    offsets topic; checked before anything is read or written."""
    if ms is None and size is None:
        raise InvalidRequestError("nothing to change: give retention_ms or retention_bytes")
    if name == CONSUMER_OFFSETS_TOPIC:
        raise InvalidRequestError(
            f"{CONSUMER_OFFSETS_TOPIC} is compacted; its retention cannot be changed"
        )


def read_retention(conn: Connection, name: str) -> TopicRetention | None:
    row = conn.execute(
        sa.select(topics.c.retention_ms, topics.c.retention_bytes).where(topics.c.name == name)
    ).first()
    return None if row is None else TopicRetention(int(row.retention_ms), int(row.retention_bytes))


def alter_retention(
    conn: Connection, name: str, ms: int | None, size: int | None
) -> TopicRetention:
    """Write the topic's new retention (the fields given; the others kept) in the
    caller's transaction; ``UNKNOWN_TOPIC_OR_PARTITION`` if there is no such topic."""
    stored = read_retention(conn, name)
    if stored is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
    after = stored.with_defaults(ms, size)
    conn.execute(
        topics.update()
        .where(topics.c.name == name)
        .values(retention_ms=after.ms, retention_bytes=after.bytes)
    )
    return after
