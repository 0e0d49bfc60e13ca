"""The on-disk frame of a record batch.

A batch is the unit of append, of CRC and of idempotence, as in Kafka: one produce request
becomes one batch. The frame is::

    length  u32   bytes after this field
    crc     u32   crc32 of every byte after this field
    base_offset u64, last_offset_delta u32, producer_id i64, producer_epoch i16,
    base_sequence i32, flags u16, append_time_ms i64
    leader_epoch  i32, present when flags has FLAG_LEADER_EPOCH
    slot          i32, present when flags has FLAG_SLOT
    payload       orjson: [[key, value, headers, timestamp_ms], ...] for data,
                  {"type": "COMMIT"|"ABORT", "coordinator_epoch": n} for a control batch

Non-idempotent batches carry producer_id -1. A torn or corrupt frame fails ``check`` and
recovery truncates the log before it.

The leader epoch (Kafka's partitionLeaderEpoch) is the epoch of the leader that first
appended the batch. Followers copy frames byte for byte, so every replica knows which
leader wrote each batch, which is what truncation after a leader change compares
(KIP-101). Frames written before replication existed have no such field and count as
epoch 0, the first leader's: the flag tells the two shapes apart, so old logs stay
readable.

The slot names one of several sequence spaces under one producer id and epoch (a Spark
micro-batch is one transaction whose tasks each write under the driver's producer, each in
a slot of its own): sequences and duplicates are per (producer id, slot) while the
transaction stays per producer id. It travels in the frame, not only in the request, so a
follower copying bytes and a recovery replaying the log rebuild the slot's sequence too.
Slot 0 — every batch that names none — is written without the flag, byte for byte the
frame of a release that knew no slots, so such logs stay readable both ways; a frame
without the flag reads as slot 0.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import orjson

HEADER = struct.Struct("<IIQIqhiHq")
HEADER_SIZE = HEADER.size  # 44
LEADER_EPOCH = struct.Struct("<i")
SLOT = struct.Struct("<i")
PREFIX_SIZE = 8  # length + crc
MAX_FRAME_BYTES = 64 * 1024 * 1024

FLAG_TRANSACTIONAL = 0x1
FLAG_CONTROL = 0x2
FLAG_BASE64 = 0x4
FLAG_LEADER_EPOCH = 0x8  # the header is followed by the leader epoch
FLAG_SLOT = 0x10  # a slot follows the header (and the leader epoch, when both are there)

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
DEFAULT_SLOT = 0
MAX_SLOT = 2**31 - 1


class CorruptBatchError(Exception):
    """The bytes at a position are not a whole, valid batch."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A batch's header, enough for recovery and producer-state replay without the payload."""

    base_offset: int
    last_offset_delta: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    flags: int
    append_time_ms: int
    position: int  # where the frame starts in its segment
    frame_size: int  # bytes of the whole frame, prefix included
    leader_epoch: int = 0
    slot: int = DEFAULT_SLOT

    @property
    def payload_start(self) -> int:
        """Where the payload starts, counted from the start of the frame."""
        return _payload_start(self.flags)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def record_count(self) -> int:
        return self.last_offset_delta + 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.flags & FLAG_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)

    @property
    def is_base64(self) -> bool:
        return bool(self.flags & FLAG_BASE64)

    @property
    def has_producer(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def encode(
    *,
    base_offset: int,
    record_count: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    flags: int,
    append_time_ms: int,
    payload: bytes,
    leader_epoch: int = 0,
    slot: int = DEFAULT_SLOT,
) -> bytes:
    """Frame a batch; the CRC covers the header fields, the leader epoch, the slot and the
    payload. Slot 0 is left out (no FLAG_SLOT): the frame of a batch without a slot does
    not change."""
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} is outside [0, {MAX_SLOT}]")
    flags = (flags | FLAG_LEADER_EPOCH) & ~FLAG_SLOT
    if slot != DEFAULT_SLOT:
        flags |= FLAG_SLOT
    body = (
        HEADER.pack(
            0,
            0,
            base_offset,
            record_count - 1,
            producer_id,
            producer_epoch,
            base_sequence,
            flags,
            append_time_ms,
        )[PREFIX_SIZE:]
        + LEADER_EPOCH.pack(leader_epoch)
        + (SLOT.pack(slot) if flags & FLAG_SLOT else b"")
        + payload
    )
    crc = zlib.crc32(body)
    return struct.pack("<II", len(body) + 4, crc) + body


def peek_size(buffer: bytes | memoryview, start: int) -> int | None:
    """Size of the frame starting at ``start``, or None if the prefix is not all there."""
    if len(buffer) - start < PREFIX_SIZE:
        return None
    (length,) = struct.unpack_from("<I", buffer, start)
    if length < HEADER_SIZE - 4 or length > MAX_FRAME_BYTES:
        raise CorruptBatchError(f"impossible frame length {length}")
    return int(length) + 4


def decode_header(
    buffer: bytes | memoryview, start: int, position: int, *, verify: bool
) -> BatchHeader:
    """Read the header of the frame at ``start`` of ``buffer`` (``position`` in the file)."""
    size = peek_size(buffer, start)
    if size is None or len(buffer) - start < size:
        raise CorruptBatchError("truncated frame")
    fields = HEADER.unpack_from(buffer, start)
    if verify and zlib.crc32(buffer[start + PREFIX_SIZE : start + size]) != fields[1]:
        raise CorruptBatchError(f"crc mismatch at position {position}")
    flags = fields[7]
    if size < _payload_start(flags):
        raise CorruptBatchError(f"frame too short for its leader epoch or slot at {position}")
    leader_epoch = 0
    if flags & FLAG_LEADER_EPOCH:
        (leader_epoch,) = LEADER_EPOCH.unpack_from(buffer, start + HEADER_SIZE)
    slot = DEFAULT_SLOT
    if flags & FLAG_SLOT:
        offset = HEADER_SIZE + (LEADER_EPOCH.size if flags & FLAG_LEADER_EPOCH else 0)
        (slot,) = SLOT.unpack_from(buffer, start + offset)
        if slot < 0:
            raise CorruptBatchError(f"negative slot {slot} at {position}")
    return BatchHeader(
        base_offset=fields[2],
        last_offset_delta=fields[3],
        producer_id=fields[4],
        producer_epoch=fields[5],
        base_sequence=fields[6],
        flags=flags,
        append_time_ms=fields[8],
        position=position,
        frame_size=size,
        leader_epoch=leader_epoch,
        slot=slot,
    )


def _payload_start(flags: int) -> int:
    """Bytes before the payload in a frame with ``flags``: header, then the optional fields
    in their fixed order (leader epoch, slot)."""
    return (
        HEADER_SIZE
        + (LEADER_EPOCH.size if flags & FLAG_LEADER_EPOCH else 0)
        + (SLOT.size if flags & FLAG_SLOT else 0)
    )


def payload_of(buffer: bytes | memoryview, start: int, header: BatchHeader) -> Any:
    """Decode the payload of the frame at ``start``."""
    return orjson.loads(buffer[start + header.payload_start : start + header.frame_size])


def encode_records(rows: list[tuple[str | None, str | None, dict[str, str] | None, int]]) -> bytes:
    return orjson.dumps(rows)


def encode_control(result: str, coordinator_epoch: int) -> bytes:
    return orjson.dumps({"type": result, "coordinator_epoch": coordinator_epoch})
