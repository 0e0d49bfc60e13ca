"""Where a record or a group's offsets live: rules every party must compute alike.

A keyed record goes to Kafka's partition for its key (``murmur2``), so a producer of this
SDK, a Spark writer and a Kafka client agree on placement. A consumer group's offsets live
in one ``__consumer_offsets`` partition chosen from the group id: the coordinator names it
in ``add_offsets`` answers and metadata, and the storage node checks it on every offsets
request, so the two must never differ.
"""

from __future__ import annotations

import zlib

#: The seed of Kafka's murmur2 (``Utils.murmur2``).
MURMUR2_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``Utils.murmur2``), as a signed 32-bit int, so keyed records land
    on the partition a Kafka client would choose."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (MURMUR2_SEED ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_bytes(key: str | bytes) -> bytes:
    """A record key as the bytes ``murmur2`` hashes (text as UTF-8)."""
    return key if isinstance(key, bytes) else key.encode()


def keyed_partition(key: str | bytes, partitions: int) -> int:
    """Kafka's default partition for a keyed record: ``murmur2(key) & 0x7fffffff % n``."""
    return (murmur2(key_bytes(key)) & 0x7FFFFFFF) % partitions


def group_offsets_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition that holds this group's offsets."""
    return zlib.crc32(group_id.encode()) % partitions
