"""Kafka's keyed placement, at the speed of C when the ``murmurhash2`` extension is there.

Every keyed record is hashed once on the way in: in pure Python (``eos_protocol.
partitioning.murmur2``) that takes 3 to 6 µs for a short key, as much as everything else a
``send`` does, which made keyed records markedly dearer to send than keyless ones. The
extension computes the same MurmurHash2 (Kafka's, seed ``0x9747b28c``; the test suite
checks the two agree on random keys of every length) in a fraction of a microsecond. It
is a dependency of the SDK; where it cannot be installed, the pure version is used and
places every record on the same partition, only slower.
"""

from __future__ import annotations

from collections.abc import Callable

from eos_protocol.partitioning import MURMUR2_SEED, key_bytes
from eos_protocol.partitioning import keyed_partition as pure_keyed_partition

_native: Callable[[bytes, int], int] | None
try:
    from murmurhash2 import murmurhash2 as _native
except ImportError:  # pragma: no cover - the extension is a dependency
    _native = None


def native_murmur2(data: bytes) -> int | None:
    """The extension's hash of ``data`` as an unsigned 32-bit int; None without it."""
    return None if _native is None else _native(data, MURMUR2_SEED) & 0xFFFFFFFF


def _native_keyed_partition(key: str | bytes, partitions: int) -> int:
    assert _native is not None
    return (_native(key_bytes(key), MURMUR2_SEED) & 0x7FFFFFFF) % partitions


#: Kafka's default partition of a keyed record: ``murmur2(key) & 0x7fffffff % n``.
keyed_partition: Callable[[str | bytes, int], int] = (
    pure_keyed_partition if _native is None else _native_keyed_partition
)
