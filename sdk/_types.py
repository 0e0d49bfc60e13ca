"""Value types of the public API: topic-partitions, offsets, record metadata, records.

They are small immutable tuples so users can build them by hand, compare them, use them as
dictionary keys (``{TopicPartition("orders", 0): 42}``), and unpack them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

#: A key or value as the user gives it: text travels as UTF-8, bytes as base64.
Payload = str | bytes


class TopicPartition(NamedTuple):
    """One partition of one topic.

    >>> TopicPartition("orders", 0)
    TopicPartition(topic='orders', partition=0)
    """

    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """An offset to commit for a consumer group: the *next* offset to read, as in Kafka.

    Example::

        producer.send_offsets_to_transaction(
            {TopicPartition("orders", 0): OffsetAndMetadata(42, "batch 7")}, "enricher"
        )
    """

    offset: int
    metadata: str | None = None


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``duplicate`` is true when the node recognised
    a retried batch and answered with the offsets it first assigned.

    Example::

        meta = producer.send("orders", "order-1").result()
        print(meta.partition, meta.offset)
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool = False


class ConsumerRecord(NamedTuple):
    """A record read by a ``Consumer``. Values sent as bytes come back as bytes.

    Example::

        for record in consumer.poll(timeout=1.0):
            print(record.topic, record.partition, record.offset, record.key, record.value)
    """

    topic: str
    partition: int
    offset: int
    key: Payload | None
    value: Payload | None
    headers: dict[str, str]
    timestamp_ms: int


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """Who a consumer is in its group, for a transaction that commits its offsets
    (KIP-447): with it, the coordinator refuses the offsets (and the commit) of a member
    that was fenced or lost the partitions since it read them. ``member_id`` is None and
    ``member_epoch`` -1 while the consumer is no member (not subscribed, or joining).

    Example::

        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
    """

    group_id: str
    member_id: str | None = None
    member_epoch: int = -1
    instance_id: str | None = None


#: Offsets as the calls take them: keyed by ``TopicPartition`` or plain ``(topic, partition)``
#: tuples, valued by a bare offset or an ``OffsetAndMetadata``. (Two mappings, since a
#: mapping's key type is invariant.)
Offsets = (
    Mapping[TopicPartition, int | OffsetAndMetadata]
    | Mapping[tuple[str, int], int | OffsetAndMetadata]
)


def as_topic_partition(tp: TopicPartition | tuple[str, int]) -> TopicPartition:
    """Accept a plain ``(topic, partition)`` tuple wherever a ``TopicPartition`` is wanted."""
    if isinstance(tp, TopicPartition):
        return tp
    topic, partition = tp
    return TopicPartition(str(topic), int(partition))


def as_offset(value: int | OffsetAndMetadata) -> OffsetAndMetadata:
    if isinstance(value, OffsetAndMetadata):
        return value
    return OffsetAndMetadata(int(value))
