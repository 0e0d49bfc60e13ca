"""Where a record or a group's offsets live: rules every party must compute alike.

A keyed record goes to Kafka's partition for its key (``murmur2``), so a producer of this
SDK, a Spark writer and a Kafka client agree on placement. A consumer group's offsets live
in one ``__consumer_offsets`` partition chosen from the group id: the coordinator names it
in ``add_offsets`` answers and metadata, and the storage node checks it on every offsets
request, so the two must never differ.
"""

from __future__ import annotations

import struct
import zlib

#: The seed of Kafka's murmur2 (``Utils.murmur2``).
MURMUR2_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``Utils.murmur2``), as a signed 32-bit int, so keyed records land
    on the partition a Kafka client would choose. The 4-byte words are unpacked in one
    call (``struct``), the cheapest way in Python: every keyed record is hashed on its
    way in, and a C extension that does it releases the GIL on each call, which in a
    producer with a sender thread cost a thread switch per record."""
    m, mask = _M, _MASK
    length = len(data)
    h = (MURMUR2_SEED ^ length) & mask
    words = length >> 2
    if words:
        unpack = _UNPACK[words] if words < len(_UNPACK) else struct.Struct(f"<{words}I").unpack_from
        for k in unpack(data):
            k = (k * m) & mask
            k = ((k ^ (k >> 24)) * m) & mask
            h = ((h * m) & mask) ^ k
    rest = length & 3
    if rest:
        tail = length - rest
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h = ((h ^ data[tail]) * m) & mask
    h = ((h ^ (h >> 13)) * m) & mask
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
#: ``unpack_from`` of n little-endian 32-bit words, for keys of up to 255 bytes.
_UNPACK = [struct.Struct(f"<{n}I").unpack_from for n in range(64)]


def key_bytes(key: str | bytes) -> bytes:
    """A record key as the bytes ``murmur2`` hashes (text as UTF-8)."""
    return key if isinstance(key, bytes) else key.encode()


def keyed_partition(key: str | bytes, partitions: int) -> int:
    """Kafka's default partition for a keyed record: ``murmur2(key) & 0x7fffffff % n``."""
    return (murmur2(key_bytes(key)) & 0x7FFFFFFF) % partitions


def group_offsets_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition that holds this group's offsets."""
    return zlib.crc32(group_id.encode()) % partitions
