"""The log engine as a replica: leader epochs in the frames and in the epoch cache, frames
copied from a leader byte for byte, and truncation after a leader change (KIP-101/279).

A follower's state must be the leader's: the same bytes at the same offsets, and from them
the same producer state (so a promoted follower still recognises a retried batch), the same
open transactions and aborted-transaction index (so read_committed filters the same)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from eos_protocol import errors
from partition_service.log import batch as frames
from partition_service.log.engine import PartitionEngine
from partition_service.log.epochs import EPOCH_FILE, UNDEFINED, LeaderEpochCache, StaleEpochError
from partition_service.log.log import read_checkpoint
from tests.partition.engine_support import NOW, marker, open_engine, produce, values

pytestmark = pytest.mark.unit


def copy_all(leader: PartitionEngine, follower: PartitionEngine, max_bytes: int = 300) -> None:
    """What a follower's fetcher does, in small steps."""
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.read_frames(follower.log_end_offset, max_bytes)
        assert data, "a fetch below the leader's log end returns at least one batch"
        follower.append_replicated(data)
    follower.mark_durable(follower.log_end_offset)


def log_bytes(engine: PartitionEngine) -> bytes:
    return engine.read_frames(engine.log_start_offset, 1 << 30)


# --- the epoch cache --------------------------------------------------------------------


def test_end_offset_for_an_epoch_follows_kafka(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.end_offset_for(0, 0) == (UNDEFINED, UNDEFINED)
    for epoch, start in ((1, 0), (3, 10), (4, 25)):
        assert cache.assign(epoch, start)
    assert not cache.assign(4, 30), "the same epoch again changes nothing"
    assert cache.end_offset_for(4, 40) == (4, 40)  # the newest ends at the log end
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(2, 40) == (1, 10)  # unknown here: the floor epoch's end
    assert cache.end_offset_for(0, 40) == (0, 0)  # older than all: where the first began
    assert cache.end_offset_for(5, 40) == (UNDEFINED, UNDEFINED)
    assert cache.epoch_at(9) == 1 and cache.epoch_at(10) == 3 and cache.epoch_at(99) == 4
    with pytest.raises(StaleEpochError):
        cache.assign(2, 50)

    reread = LeaderEpochCache(tmp_path)
    assert reread.load() and reread.entries == [(1, 0), (3, 10), (4, 25)]
    cache.truncate_from_end(25)
    assert LeaderEpochCache(tmp_path).load() and cache.entries == [(1, 0), (3, 10)]
    assert cache.assign(7, 10) and cache.entries == [(1, 0), (7, 10)], "epoch 3 wrote nothing"


def test_a_damaged_epoch_file_is_not_trusted(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    cache.assign(2, 5)
    path = tmp_path / EPOCH_FILE
    path.write_bytes(path.read_bytes().replace(b"2 5", b"2 6"))
    assert not LeaderEpochCache(tmp_path).load()
    body = b"3 0\n1 5\n"  # a whole file, but epochs that go backwards
    path.write_bytes(body + b"\n" + str(zlib.crc32(body)).encode())
    assert not LeaderEpochCache(tmp_path).load()


# --- epochs in the log ------------------------------------------------------------------


def test_each_batch_carries_the_epoch_of_the_leader_that_wrote_it(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a", "b"])
    engine.become_leader(3)
    produce(engine, ["c"])
    engine.become_leader(5)
    produce(engine, ["d", "e"])
    assert engine.epochs.entries == [(0, 0), (3, 2), (5, 3)]
    assert engine.end_offset_for(3) == (3, 3)
    assert engine.end_offset_for(4) == (3, 3)
    assert engine.end_offset_for(5) == (5, 5)
    with pytest.raises(StaleEpochError):
        engine.become_leader(4)
    engine.close()

    (tmp_path / "p" / EPOCH_FILE).unlink()  # lost: rebuilt from the frames themselves
    reopened = open_engine(tmp_path / "p")
    assert reopened.epochs.entries == [(0, 0), (3, 2), (5, 3)]
    assert reopened.leader_epoch == 5
    assert values(reopened, committed=True) == ["a", "b", "c", "d", "e"]


def test_a_frame_of_the_first_version_reads_as_epoch_0(tmp_path: Path) -> None:
    """Logs written before frames had a leader epoch stay readable."""
    payload = frames.encode_records([("k", "old", None, NOW)])
    body = frames.HEADER.pack(0, 0, 0, 0, -1, -1, -1, 0, NOW)[frames.PREFIX_SIZE :] + payload
    old = struct.pack("<II", len(body) + 4, zlib.crc32(body)) + body
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "00000000000000000000.log").write_bytes(old)
    engine = open_engine(directory)
    assert values(engine, committed=False) == ["old"]
    assert engine.epochs.entries == [(0, 0)]
    produce(engine, ["new"])
    assert values(engine, committed=False) == ["old", "new"]


# --- copying from a leader --------------------------------------------------------------


def test_a_follower_copies_bytes_and_rebuilds_the_same_state(tmp_path: Path) -> None:
    leader, follower = open_engine(tmp_path / "l"), open_engine(tmp_path / "f")
    leader.become_leader(1)
    produce(leader, ["p0", "p1"], pid=7, epoch=0, seq=0)
    produce(leader, ["t0", "t1"], pid=8, epoch=2, seq=0, txn=True)
    marker(leader, 8, 2, "ABORT")
    produce(leader, ["t2"], pid=8, epoch=2, seq=2, txn=True)
    marker(leader, 8, 2, "COMMIT")
    produce(leader, ["open"], pid=9, epoch=0, seq=0, txn=True)  # still open
    copy_all(leader, follower)

    assert log_bytes(follower) == log_bytes(leader)
    assert follower.epochs.entries == leader.epochs.entries == [(1, 0)]
    assert follower.last_stable_offset == leader.last_stable_offset
    assert values(follower, committed=True) == values(leader, committed=True) == ["p0", "p1", "t2"]
    assert follower.producers.to_json() == leader.producers.to_json()

    follower.become_leader(2)  # promoted: the old leader's producers are known here
    retried = produce(follower, ["p0", "p1"], pid=7, epoch=0, seq=0)
    assert retried.duplicate and retried.base_offset == 0
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        produce(follower, ["gap"], pid=7, epoch=0, seq=5)
    marker(follower, 9, 0, "ABORT")
    assert values(follower, committed=True) == ["p0", "p1", "t2"]


def test_damaged_or_misplaced_frames_change_nothing(tmp_path: Path) -> None:
    leader, follower = open_engine(tmp_path / "l"), open_engine(tmp_path / "f")
    for i in range(3):
        produce(leader, [f"v{i}"])
    data = bytearray(leader.read_frames(0, 1 << 20))
    data[-3] ^= 0xFF  # the last frame's payload
    with pytest.raises(frames.CorruptBatchError):
        follower.append_replicated(bytes(data))
    assert follower.log_end_offset == 0
    with pytest.raises(frames.CorruptBatchError, match="where 0 was expected"):
        follower.append_replicated(leader.read_frames(1, 1 << 20))
    assert follower.log_end_offset == 0
    with pytest.raises(errors.OffsetOutOfRangeError):
        leader.read_frames(4, 100)


# --- truncation -------------------------------------------------------------------------


def test_truncation_drops_a_divergent_suffix_and_its_state(tmp_path: Path) -> None:
    """Old leader A wrote batches in epoch 1 that follower B never got; B became leader in
    epoch 2 and wrote others at the same offsets. A, back as a follower, asks B where epoch
    1 ended and cuts there: the two logs then agree byte for byte."""
    a, b = open_engine(tmp_path / "a"), open_engine(tmp_path / "b")
    a.become_leader(1)
    produce(a, ["x0", "x1"], pid=7, epoch=0, seq=0)
    copy_all(a, b)
    produce(a, ["lost"], pid=7, epoch=0, seq=2)  # never replicated, never acknowledged
    produce(a, ["t-open"], pid=8, epoch=0, seq=0, txn=True)
    marker(a, 8, 0, "ABORT")
    a.write_checkpoint(a.capture_checkpoint())  # a checkpoint above the cut must go

    b.become_leader(2)
    produce(b, ["y2"], pid=7, epoch=0, seq=2)
    produce(b, ["y3"])

    epoch, end = b.end_offset_for(a.epochs.latest_epoch)
    assert (epoch, end) == (1, 2)
    assert a.truncate_to(end) == 2
    assert a.epochs.entries == [(1, 0)]
    assert a.aborted.overlapping(0, 10) == {}
    assert a.producers.to_json() != [] and a.last_stable_offset == 2
    assert read_checkpoint(a.directory) is None, "the checkpoint above the cut is gone"
    copy_all(b, a)
    assert log_bytes(a) == log_bytes(b)
    assert values(a, committed=True) == ["x0", "x1", "y2", "y3"]
    assert a.producers.to_json() == b.producers.to_json()
    a.close()

    again = open_engine(tmp_path / "a")  # and the cut holds across a restart
    assert log_bytes(again) == log_bytes(b)
    assert again.epochs.entries == b.epochs.entries == [(1, 0), (2, 2)]


def test_truncation_inside_a_batch_cuts_at_its_start_across_segments(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    for i in range(200):
        produce(engine, [f"v{i}-a" + "x" * 100, f"v{i}-b"])
    assert len(engine.log.segments) > 3
    assert engine.truncate_to(51) == 50  # 51 is the second record of the batch at 50
    assert engine.log_end_offset == 50 and engine.log.segments[-1].base_offset <= 50
    assert len(engine.log.segments) < 3
    assert values(engine, committed=False)[-1] == "v24-b"
    produce(engine, ["after"])
    assert values(engine, committed=False, start=50) == ["after"]
    assert engine.truncate_to(1000) == 51, "beyond the end: nothing to cut"


def test_a_reader_between_the_high_watermark_and_the_log_end_waits(tmp_path: Path) -> None:
    """A promoted follower's high watermark may trail its predecessor's until the other
    replicas fetch again; a reader already past it gets nothing yet, not OFFSET_OUT_OF_RANGE
    (which would send a consumer back to its reset offset and re-read the partition)."""
    leader = open_engine(tmp_path / "l")
    leader.become_leader(1)
    produce(leader, ["a", "b", "c"], pid=7, epoch=0, seq=0)
    leader.mark_durable(leader.log_end_offset)
    leader.replicated_offset = 1  # the ISR has only the first record so far
    assert leader.high_watermark == 1 < leader.log_end_offset == 3

    waiting = leader.read(2, max_records=10, max_bytes=1 << 20, read_committed=True)
    assert waiting.records == [] and waiting.next_offset == 2
    with pytest.raises(errors.OffsetOutOfRangeError):
        leader.read(4, max_records=10, max_bytes=1 << 20, read_committed=False)
