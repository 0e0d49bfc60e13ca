"""Producer slots on the log engine: several sequence spaces under one producer id and epoch.

The tasks of one Spark micro-batch write in the driver's one transaction, under its
producer id and epoch, each in a slot of its own. Sequences and duplicates are per
(producer id, slot); the epoch, the transaction, its markers and the LSO stay per producer
id. The slot is in the frame, so recovery and a follower copying bytes see it too.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from eos_protocol import errors
from partition_service.log import batch as frames
from partition_service.log.engine import AppendResult, PartitionEngine, Row
from partition_service.log.producer_state import ProducerStateManager
from tests.partition.engine_support import NOW, marker, open_engine, values

pytestmark = pytest.mark.unit

PID, EPOCH = 40, 3


def produce(
    engine: PartitionEngine,
    values_: list[str],
    *,
    seq: int,
    slot: int = 0,
    pid: int = PID,
    epoch: int = EPOCH,
    txn: bool = True,
    now_ms: int = NOW,
) -> AppendResult:
    rows: list[Row] = [(f"k{i}", v, None, NOW) for i, v in enumerate(values_)]
    result = engine.append_data(
        rows,
        now_ms=now_ms,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
        slot=slot,
    )
    engine.mark_durable(engine.log_end_offset)
    return result


def copy_all(leader: PartitionEngine, follower: PartitionEngine) -> None:
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_replicated(leader.read_frames(follower.log_end_offset, 300))
    follower.mark_durable(follower.log_end_offset)


def interleaved(engine: PartitionEngine) -> None:
    """Three writers of one transaction: slot 0 (no slot), slots 1 and 2**31-1."""
    produce(engine, ["a0", "a1"], seq=0, slot=1)
    produce(engine, ["b0"], seq=0, slot=frames.MAX_SLOT)
    produce(engine, ["c0"], seq=0)
    produce(engine, ["a2"], seq=2, slot=1)
    produce(engine, ["b1", "b2"], seq=1, slot=frames.MAX_SLOT)
    produce(engine, ["c1"], seq=1)


# --- sequences per slot ----------------------------------------------------------------


def test_two_slots_of_one_producer_interleave_in_one_partition(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    interleaved(engine)
    assert engine.log_end_offset == 8
    assert values(engine, committed=False) == ["a0", "a1", "b0", "c0", "a2", "b1", "b2", "c1"]
    entry = engine.producers.producers[PID]
    assert entry.last_sequence == entry.last_sequence_of(0) == 1
    assert entry.last_sequence_of(1) == 2
    assert entry.last_sequence_of(frames.MAX_SLOT) == 2
    assert entry.last_sequence_of(7) == frames.NO_SEQUENCE


def test_a_resent_batch_of_a_slot_is_a_duplicate_and_written_once(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a0", "a1"], seq=0, slot=1)
    produce(engine, ["b0", "b1"], seq=0, slot=2)
    end = engine.log_end_offset
    again = produce(engine, ["a0", "a1"], seq=0, slot=1)
    assert again.duplicate and (again.base_offset, again.last_offset) == (0, 1)
    again = produce(engine, ["b0", "b1"], seq=0, slot=2)
    assert again.duplicate and (again.base_offset, again.last_offset) == (2, 3)
    assert engine.log_end_offset == end
    # the same sequences in a slot that has not written them are a new batch, not a duplicate
    fresh = produce(engine, ["c0", "c1"], seq=0, slot=3)
    assert not fresh.duplicate and fresh.base_offset == end


def test_each_slot_keeps_its_own_last_five_batches(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    for i in range(7):
        produce(engine, [f"a{i}"], seq=i, slot=1)
        produce(engine, [f"b{i}"], seq=i, slot=2)
    end = engine.log_end_offset
    # batches 2..6 of each slot are remembered although ten batches came after slot 1's #2
    assert produce(engine, ["a2"], seq=2, slot=1).base_offset == 4
    assert produce(engine, ["b6"], seq=6, slot=2).base_offset == 13
    assert engine.log_end_offset == end
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="in slot 1"):
        produce(engine, ["a1"], seq=1, slot=1)  # older than its slot's last five


def test_out_of_order_within_a_slot_is_refused(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a0"], seq=0, slot=1)
    produce(engine, ["b0", "b1", "b2"], seq=0, slot=2)
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="expected sequence 1"):
        produce(engine, ["a3"], seq=3, slot=1)  # slot 2 is at 3, slot 1 is not
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="in slot 5"):
        produce(engine, ["x"], seq=1, slot=5)  # a slot's first batch starts at 0
    assert engine.log_end_offset == 4
    assert not produce(engine, ["a1"], seq=1, slot=1).duplicate


def test_an_unknown_producer_starts_every_slot_at_zero(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    with pytest.raises(errors.UnknownProducerIdError, match="in slot 4"):
        produce(engine, ["x"], seq=2, slot=4)
    assert engine.log_end_offset == 0


def test_a_new_epoch_restarts_every_slot_and_fences_the_old_one(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a0"], seq=0, slot=1, txn=False)
    produce(engine, ["b0", "b1"], seq=0, slot=2, txn=False)
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="must start at sequence 0"):
        produce(engine, ["b2"], seq=2, slot=2, epoch=EPOCH + 1, txn=False)
    produce(engine, ["n0"], seq=0, slot=2, epoch=EPOCH + 1, txn=False)
    entry = engine.producers.producers[PID]
    assert entry.epoch == EPOCH + 1 and list(entry.slots) == [2]  # slot 1's state is gone
    for slot in (0, 1, 2):
        with pytest.raises(errors.InvalidProducerEpochError):
            produce(engine, ["old"], seq=1, slot=slot, txn=False)
        with pytest.raises(errors.ProducerFencedError):
            produce(engine, ["old"], seq=1, slot=slot)
    produce(engine, ["m0"], seq=0, slot=1, epoch=EPOCH + 1, txn=False)
    assert values(engine, committed=False) == ["a0", "b0", "b1", "n0", "m0"]


def test_a_marker_of_a_newer_epoch_drops_the_slots_and_fences_late_retries(
    tmp_path: Path,
) -> None:
    """Transaction version 2: every end bumps the epoch, so the slots go with the marker
    and a late retry of the ended transaction is fenced, not appended."""
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a0"], seq=0, slot=1)
    produce(engine, ["b0"], seq=0, slot=2)
    marker(engine, PID, EPOCH + 1, "COMMIT")
    entry = engine.producers.producers[PID]
    assert entry.slots == {} and not entry.batches
    with pytest.raises(errors.ProducerFencedError):
        produce(engine, ["a0"], seq=0, slot=1)
    assert not produce(engine, ["next"], seq=0, slot=1, epoch=EPOCH + 1).duplicate


def test_a_late_retry_after_a_commit_at_the_same_epoch_is_still_a_duplicate(
    tmp_path: Path,
) -> None:
    """Transaction version 1: the marker keeps the epoch, so the slots keep their
    sequences; a retry arriving after the commit must not be appended again, not even
    inside the producer's next transaction."""
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a0"], seq=0, slot=1)
    produce(engine, ["b0"], seq=0, slot=2)
    marker(engine, PID, EPOCH, "COMMIT")
    late = produce(engine, ["b0"], seq=0, slot=2)
    assert late.duplicate and late.base_offset == 1
    produce(engine, ["a1"], seq=1, slot=1)  # the next transaction continues the slot
    late = produce(engine, ["b0"], seq=0, slot=2)
    assert late.duplicate and late.base_offset == 1
    marker(engine, PID, EPOCH, "COMMIT")
    assert values(engine, committed=True) == ["a0", "b0", "a1"]


# --- one transaction across slots ------------------------------------------------------


def test_one_commit_marker_shows_every_slot_and_one_abort_hides_them(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    interleaved(engine)
    assert values(engine, committed=True) == []
    marker(engine, PID, EPOCH, "COMMIT")
    committed = ["a0", "a1", "b0", "c0", "a2", "b1", "b2", "c1"]
    assert values(engine, committed=True) == committed
    assert engine.producers.open_transactions == {}

    produce(engine, ["a3"], seq=3, slot=1)
    produce(engine, ["b3"], seq=3, slot=frames.MAX_SLOT)
    produce(engine, ["c2"], seq=2)
    marker(engine, PID, EPOCH, "ABORT")
    produce(engine, ["plain"], seq=0, pid=PID + 1, epoch=0, txn=False)
    assert values(engine, committed=True) == [*committed, "plain"]
    assert engine.aborted.overlapping(0, engine.log_end_offset) == {PID: [(9, 12)]}


def test_the_lso_stays_at_the_first_open_record_of_any_slot(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["other"], seq=0, pid=PID + 1, epoch=0, txn=False)
    produce(engine, ["a0"], seq=0, slot=6)
    assert engine.last_stable_offset == 1
    produce(engine, ["b0"], seq=0, slot=2)
    produce(engine, ["c0"], seq=0)
    produce(engine, ["a1"], seq=1, slot=6)
    assert engine.last_stable_offset == 1
    assert values(engine, committed=True) == ["other"]
    marker(engine, PID, EPOCH, "COMMIT")
    assert engine.last_stable_offset == engine.high_watermark == 6


# --- the slot on disk: recovery, followers, old frames ---------------------------------


def test_slot_state_survives_a_restart_by_replay_and_by_checkpoint(tmp_path: Path) -> None:
    for use_checkpoint in (False, True):
        directory = tmp_path / f"p-{use_checkpoint}"
        engine = open_engine(directory)
        interleaved(engine)
        if use_checkpoint:
            engine.write_checkpoint(engine.capture_checkpoint())
        produce(engine, ["a3"], seq=3, slot=1)  # after the checkpoint: replayed
        before = engine.producers.to_json()
        engine.close()

        engine = open_engine(directory)
        assert engine.producers.to_json() == before
        assert engine.last_stable_offset == 0
        assert produce(engine, ["b1", "b2"], seq=1, slot=frames.MAX_SLOT).duplicate
        assert produce(engine, ["a3"], seq=3, slot=1).duplicate
        with pytest.raises(errors.OutOfOrderSequenceNumberError):
            produce(engine, ["c3"], seq=3)
        produce(engine, ["b3"], seq=3, slot=frames.MAX_SLOT)
        marker(engine, PID, EPOCH, "COMMIT")
        assert values(engine, committed=True)[-2:] == ["a3", "b3"]
        engine.close()


def test_a_follower_copies_the_slots_and_recognises_their_retries(tmp_path: Path) -> None:
    leader, follower = open_engine(tmp_path / "l"), open_engine(tmp_path / "f")
    leader.become_leader(1)
    interleaved(leader)
    marker(leader, PID, EPOCH, "ABORT")
    produce(leader, ["a3"], seq=3, slot=1)
    copy_all(leader, follower)

    assert follower.read_frames(0, 1 << 30) == leader.read_frames(0, 1 << 30)
    assert follower.producers.to_json() == leader.producers.to_json()
    assert follower.last_stable_offset == leader.last_stable_offset == 9

    follower.become_leader(2)  # promoted: the slots' retries are still duplicates
    assert produce(follower, ["a3"], seq=3, slot=1).duplicate
    assert produce(follower, ["b1", "b2"], seq=1, slot=frames.MAX_SLOT).duplicate
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        produce(follower, ["a9"], seq=9, slot=1)
    marker(follower, PID, EPOCH, "COMMIT")
    assert values(follower, committed=True) == ["a3"]


def test_slot_0_frames_carry_no_slot_flag_and_others_do(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["plain"], seq=0)
    produce(engine, ["slotted"], seq=0, slot=9)
    headers = [h for h, _view, _start in engine.log.batches_from(0)]
    assert [h.slot for h in headers] == [0, 9]
    assert [bool(h.flags & frames.FLAG_SLOT) for h in headers] == [False, True]
    assert headers[1].frame_size == headers[0].frame_size + frames.SLOT.size + 2  # "slotted"


def test_a_frame_without_the_slot_flag_reads_as_slot_0(tmp_path: Path) -> None:
    """Logs written before slots existed (and frames of the first version, without a
    leader epoch either) stay readable, their producers' sequences in slot 0."""
    payload = frames.encode_records([("k", "old", None, NOW)])
    fields = frames.HEADER.pack(0, 0, 0, 0, PID, EPOCH, 0, frames.FLAG_TRANSACTIONAL, NOW)
    body = fields[frames.PREFIX_SIZE :] + payload
    old = struct.pack("<II", len(body) + 4, zlib.crc32(body)) + body
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "00000000000000000000.log").write_bytes(old)

    engine = open_engine(directory)
    assert [h.slot for h, _v, _s in engine.log.batches_from(0)] == [0]
    entry = engine.producers.producers[PID]
    assert entry.last_sequence_of(0) == 0 and entry.slots == {}
    assert produce(engine, ["old"], seq=0).duplicate
    produce(engine, ["new"], seq=0, slot=1)
    produce(engine, ["next"], seq=1)
    marker(engine, PID, EPOCH, "COMMIT")
    assert values(engine, committed=True) == ["old", "new", "next"]


def test_a_slot_without_a_leader_epoch_and_a_short_frame(tmp_path: Path) -> None:
    """The slot follows the header directly when the frame has no leader epoch; a frame
    too short for the fields its flags announce is corrupt."""
    payload = frames.encode_records([("k", "v", None, NOW)])
    head = frames.HEADER.pack(0, 0, 5, 0, PID, EPOCH, 0, frames.FLAG_SLOT, NOW)
    body = head[frames.PREFIX_SIZE :] + frames.SLOT.pack(77) + payload
    frame = struct.pack("<II", len(body) + 4, zlib.crc32(body)) + body
    header = frames.decode_header(frame, 0, 0, verify=True)
    assert (header.slot, header.leader_epoch, header.base_offset) == (77, 0, 5)
    assert frames.payload_of(frame, 0, header) == [["k", "v", None, NOW]]

    short = head[frames.PREFIX_SIZE :]
    frame = struct.pack("<II", len(short) + 4, zlib.crc32(short)) + short
    with pytest.raises(frames.CorruptBatchError, match="too short"):
        frames.decode_header(frame, 0, 0, verify=True)
    with pytest.raises(ValueError, match="slot"):
        frames.encode(
            base_offset=0, record_count=1, producer_id=PID, producer_epoch=EPOCH,
            base_sequence=0, flags=0, append_time_ms=NOW, payload=payload, slot=-1,
        )  # fmt: skip


# --- memory ----------------------------------------------------------------------------


def test_idle_slots_expire_but_not_while_their_transaction_is_open() -> None:
    state = ProducerStateManager()
    state.apply_data(PID, EPOCH, 0, 0, 0, 1_000, transactional=True, slot=1)
    state.apply_data(PID, EPOCH, 0, 1, 1, 1_000, transactional=True, slot=2)
    state.apply_data(PID, EPOCH, 1, 2, 2, 9_000, transactional=True, slot=2)
    state.expire(now_ms=10_000, expiration_ms=5_000)
    assert sorted(state.producers[PID].slots) == [1, 2]  # the transaction is open
    state.apply_marker(PID, EPOCH, 0, 9_500, offset=3)
    state.expire(now_ms=10_000, expiration_ms=5_000)
    assert sorted(state.producers[PID].slots) == [2]  # slot 1 idle since 1_000
    state.expire(now_ms=100_000, expiration_ms=5_000)
    assert PID not in state.producers


def test_a_snapshot_keeps_the_slots_and_one_without_them_reads_as_before() -> None:
    state = ProducerStateManager()
    state.apply_data(PID, EPOCH, 0, 0, 1, 1_000, transactional=False)
    state.apply_data(PID, EPOCH, 0, 2, 4, 2_000, transactional=False, slot=3)
    raw = state.to_json()
    restored = ProducerStateManager.from_json(raw)
    assert restored.to_json() == raw
    assert restored.producers[PID].last_sequence_of(3) == 2
    assert restored.producers[PID].find_duplicate(0, 2, slot=3) is not None
    assert restored.producers[PID].find_duplicate(0, 2) is None
    without = [{k: v for k, v in item.items() if k != "slots"} for item in raw]
    assert ProducerStateManager.from_json(without).producers[PID].slots == {}
    plain = ProducerStateManager()
    plain.apply_data(PID, EPOCH, 0, 0, 1, 1_000, transactional=False)
    assert "slots" not in plain.to_json()[0]
