"""The log engine on its own: appends, idempotence, transactions, reads and recovery."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from eos_protocol import errors
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import CHECKPOINT_FILE, LogConfig
from tests.partition.engine_support import NOW, SMALL, marker, open_engine, produce, values

pytestmark = pytest.mark.unit


def test_appends_get_consecutive_offsets_and_read_back(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    first = produce(engine, ["a", "b", "c"])
    second = produce(engine, ["d"])
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 3)
    assert values(engine, committed=False) == ["a", "b", "c", "d"]
    assert values(engine, committed=False, start=2) == ["c", "d"]


def test_records_are_invisible_until_durable(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    engine.append_data([("k", "v", None, NOW)], now_ms=NOW)
    assert engine.high_watermark == 0
    assert engine.read(0, max_records=10, max_bytes=1 << 20, read_committed=False).records == []
    engine.mark_durable(engine.log_end_offset)
    assert engine.high_watermark == 1


def test_duplicate_batch_answers_first_offsets_and_writes_nothing(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    for i in range(7):
        produce(engine, [f"v{i}a", f"v{i}b"], pid=5, epoch=0, seq=2 * i)
    end = engine.log_end_offset
    # each of the last five batches is recognised; the oldest ones are forgotten
    again = produce(engine, ["x", "y"], pid=5, epoch=0, seq=12)
    assert again.duplicate and (again.base_offset, again.last_offset) == (12, 13)
    again = produce(engine, ["x", "y"], pid=5, epoch=0, seq=4)
    assert again.duplicate and again.base_offset == 4
    assert engine.log_end_offset == end
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        produce(engine, ["x", "y"], pid=5, epoch=0, seq=2)  # older than the last five


def test_sequence_gap_is_refused(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a"], pid=1, epoch=0, seq=0)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        produce(engine, ["b"], pid=1, epoch=0, seq=2)
    assert engine.log_end_offset == 1


def test_unknown_producer_must_start_at_zero(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    with pytest.raises(errors.UnknownProducerIdError):
        produce(engine, ["a"], pid=9, epoch=0, seq=3)


def test_stale_epoch_fenced_and_new_epoch_restarts_at_zero(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a", "b"], pid=1, epoch=1, seq=0)
    with pytest.raises(errors.InvalidProducerEpochError):
        produce(engine, ["c"], pid=1, epoch=0, seq=2)
    with pytest.raises(errors.ProducerFencedError):
        produce(engine, ["c"], pid=1, epoch=0, seq=2, txn=True)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        produce(engine, ["c"], pid=1, epoch=2, seq=2)
    assert not produce(engine, ["c"], pid=1, epoch=2, seq=0).duplicate


def test_sequence_wraps_at_int_max(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    engine.producers.apply_data(3, 0, 2**31 - 3, 0, 0, NOW, transactional=False)
    engine.producers.producers[3].batches[-1].last_seq = 2**31 - 2
    produce(engine, ["a", "b"], pid=3, epoch=0, seq=2**31 - 1)  # seqs 2^31-1 and 0
    assert engine.producers.producers[3].last_sequence == 0
    produce(engine, ["c"], pid=3, epoch=0, seq=1)


def test_lso_and_read_committed_with_commit_and_abort(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["plain"])
    produce(engine, ["t1-a"], pid=1, epoch=0, seq=0, txn=True)
    produce(engine, ["t2-a"], pid=2, epoch=0, seq=0, txn=True)
    produce(engine, ["t1-b"], pid=1, epoch=0, seq=1, txn=True)
    assert engine.last_stable_offset == 1
    assert values(engine, committed=True) == ["plain"]
    assert values(engine, committed=False) == ["plain", "t1-a", "t2-a", "t1-b"]
    marker(engine, 2, 0, "ABORT")
    assert engine.last_stable_offset == 1  # producer 1 is still open
    marker(engine, 1, 0, "COMMIT")
    assert engine.last_stable_offset == engine.high_watermark
    assert values(engine, committed=True) == ["plain", "t1-a", "t1-b"]
    assert "t2-a" in values(engine, committed=False)  # read_uncommitted sees aborted data


def test_repeated_marker_is_harmless(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a"], pid=1, epoch=0, seq=0, txn=True)
    marker(engine, 1, 0, "COMMIT")
    end = engine.log_end_offset
    marker(engine, 1, 0, "COMMIT")
    assert engine.log_end_offset == end
    assert values(engine, committed=True) == ["a"]


def test_marker_from_older_coordinator_epoch_is_fenced(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a"], pid=1, epoch=0, seq=0, txn=True)
    marker(engine, 1, 0, "COMMIT", coord_epoch=4)
    produce(engine, ["b"], pid=1, epoch=0, seq=1, txn=True)
    with pytest.raises(errors.TransactionCoordinatorFencedError):
        marker(engine, 1, 0, "ABORT", coord_epoch=3)
    assert engine.last_stable_offset < engine.high_watermark


def test_fencing_marker_with_bumped_epoch_aborts_and_fences_zombie(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["zombie"], pid=1, epoch=0, seq=0, txn=True)
    marker(engine, 1, 1, "ABORT")  # the coordinator bumped the epoch first
    with pytest.raises(errors.ProducerFencedError):
        produce(engine, ["late"], pid=1, epoch=0, seq=1, txn=True)
    assert values(engine, committed=True) == []


def test_non_transactional_batch_cannot_join_open_transaction(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a"], pid=1, epoch=0, seq=0, txn=True)
    with pytest.raises(errors.InvalidTxnStateError):
        produce(engine, ["b"], pid=1, epoch=0, seq=1)


def test_fetch_past_high_watermark_is_out_of_range(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a"])
    with pytest.raises(errors.OffsetOutOfRangeError):
        engine.read(5, max_records=1, max_bytes=100, read_committed=False)
    assert engine.read(1, max_records=1, max_bytes=100, read_committed=False).records == []


def test_segments_roll_and_reads_cross_them(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    expected = []
    for i in range(300):
        produce(engine, [f"value-{i:04d}" * 3])
        expected.append(f"value-{i:04d}" * 3)
    assert len(engine.log.segments) > 3
    assert values(engine, committed=False) == expected
    assert values(engine, committed=False, start=257) == expected[257:]


def test_fetch_starts_from_the_index_not_the_log_start(tmp_path: Path) -> None:
    """The cost of a fetch does not depend on where the offset lies in the log."""
    config = LogConfig(segment_bytes=1 << 30, index_interval_bytes=512)
    engine = open_engine(tmp_path / "p", config)
    for i in range(2000):
        produce(engine, [f"v{i}" * 10])
    segment = engine.log.active
    for target in (10, 1000, 1999):
        position = segment.position_for(target)
        scanned = [h for h in segment.scan(position, verify=False) if h.base_offset <= target]
        assert len(scanned) <= 1 + 512 // 40, f"scanned {len(scanned)} batches for {target}"


def test_restart_replays_producer_state_and_transactions(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    produce(engine, ["a", "b"], pid=1, epoch=0, seq=0)
    produce(engine, ["t"], pid=2, epoch=0, seq=0, txn=True)
    produce(engine, ["u"], pid=3, epoch=0, seq=0, txn=True)
    marker(engine, 3, 0, "ABORT")
    engine.close()  # no checkpoint: everything is replayed

    reopened = open_engine(tmp_path / "p")
    assert reopened.log.recovered_batches == 4
    assert produce(reopened, ["a", "b"], pid=1, epoch=0, seq=0).duplicate
    assert reopened.last_stable_offset == 2  # producer 2 still open
    marker(reopened, 2, 0, "COMMIT")
    assert values(reopened, committed=True) == ["a", "b", "t"]


def test_checkpoint_makes_restart_replay_only_the_tail(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    for i in range(50):
        produce(engine, [f"v{i}"], pid=1, epoch=0, seq=i)
    engine.write_checkpoint(engine.capture_checkpoint())
    produce(engine, ["tail"], pid=1, epoch=0, seq=50)
    engine.close()

    reopened = open_engine(tmp_path / "p")
    assert reopened.log.recovered_batches == 1
    assert produce(reopened, ["tail"], pid=1, epoch=0, seq=50).duplicate
    assert len(values(reopened, committed=False)) == 51


def _fill(engine: PartitionEngine, n: int) -> list[str]:
    out = []
    for i in range(n):
        out.append(f"r{i}")
        produce(engine, [f"r{i}"], pid=1, epoch=0, seq=i)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_torn_tail_is_truncated_to_last_whole_batch(tmp_path: Path, seed: int) -> None:
    engine = open_engine(tmp_path / "p")
    written = _fill(engine, 120)
    engine.close()
    rng = random.Random(seed)
    segments = sorted((tmp_path / "p").glob("*.log"))
    victim = segments[-1] if seed % 2 else rng.choice(segments)
    cut = rng.randrange(1, victim.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(cut)
    if seed % 3 == 0:
        (tmp_path / "p" / CHECKPOINT_FILE).unlink(missing_ok=True)

    reopened = open_engine(tmp_path / "p")
    survived = values(reopened, committed=False)
    assert survived == written[: len(survived)], "only a prefix of whole batches survives"
    assert len(survived) < len(written)
    # the producer state matches the surviving log: the next sequence is accepted
    assert not produce(reopened, ["next"], pid=1, epoch=0, seq=len(survived)).duplicate


def test_corrupt_bytes_in_tail_are_cut(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    written = _fill(engine, 30)
    engine.close()
    segment = sorted((tmp_path / "p").glob("*.log"))[-1]
    size = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.seek(size - 5)
        f.write(b"\xff\xff\xff")
    reopened = open_engine(tmp_path / "p")
    assert values(reopened, committed=False) == written[:-1]


def test_deleted_index_is_rebuilt(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p")
    written = _fill(engine, 200)
    engine.write_checkpoint(engine.capture_checkpoint())
    engine.close()
    for index in (tmp_path / "p").glob("*.index"):
        os.unlink(index)
    reopened = open_engine(tmp_path / "p")
    assert values(reopened, committed=False) == written
    assert values(reopened, committed=False, start=150) == written[150:]


def test_group_offsets_pending_until_marker(tmp_path: Path) -> None:
    from partition_service.log.group_offsets import encode_offset_record

    engine = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
    assert engine.groups is not None
    key, value = encode_offset_record("g", "in", 0, 42, None)
    engine.append_data(
        [(key, value, None, NOW)], now_ms=NOW, producer_id=7, producer_epoch=0, transactional=True
    )
    assert engine.groups.has_pending("g") and engine.groups.offsets("g") == {}
    engine.append_marker(7, 0, 0, "COMMIT", now_ms=NOW)
    assert not engine.groups.has_pending("g")
    assert engine.groups.offsets("g") == {("in", 0): (42, None)}
    key, value = encode_offset_record("g", "in", 0, 99, None)
    engine.append_data(
        [(key, value, None, NOW)], now_ms=NOW, producer_id=7, producer_epoch=0, transactional=True
    )
    engine.append_marker(7, 0, 0, "ABORT", now_ms=NOW)
    engine.mark_durable(engine.log_end_offset)
    engine.close()
    reopened = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
    assert reopened.groups is not None
    assert reopened.groups.offsets("g") == {("in", 0): (42, None)}


def test_a_deleted_topics_offsets_are_tombstoned_and_stay_gone_after_replay(
    tmp_path: Path,
) -> None:
    """A topic's deletion writes a null value for each of its groups' offsets; the view,
    its checkpoint and a replay of the log without the checkpoint all forget them, and
    keep the other topics' offsets."""
    from partition_service.log.group_offsets import encode_offset_key, encode_offset_record

    engine = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
    assert engine.groups is not None
    rows = [(*encode_offset_record(g, t, p, 10 * p + 1, None), None, NOW)
            for g in ("a", "b") for t in ("gone", "kept") for p in (0, 1)]  # fmt: skip
    engine.append_data(rows, now_ms=NOW)
    keys = engine.groups.keys_of_topics({"gone"})
    assert sorted(keys) == [("a", "gone", 0), ("a", "gone", 1), ("b", "gone", 0), ("b", "gone", 1)]
    engine.append_data([(encode_offset_key(*k), None, None, NOW) for k in keys], now_ms=NOW)
    survivors = {("kept", 0): (1, None), ("kept", 1): (11, None)}
    assert engine.groups.offsets("a") == engine.groups.offsets("b") == survivors
    assert engine.groups.keys_of_topics({"gone"}) == []
    assert {key[1] for key, _ in engine.groups.live_below(engine.log_end_offset)} == {"kept"}
    engine.mark_durable(engine.log_end_offset)
    engine.write_checkpoint(engine.capture_checkpoint())
    engine.close()
    for from_checkpoint in (True, False):
        checkpoint = tmp_path / "o" / CHECKPOINT_FILE
        if from_checkpoint:
            assert checkpoint.exists()
        else:
            checkpoint.unlink(missing_ok=True)  # a replay of the log alone
        reopened = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
        assert reopened.groups is not None
        assert reopened.groups.offsets("a") == reopened.groups.offsets("b") == survivors, (
            f"from the checkpoint: {from_checkpoint}"
        )
        reopened.close()


def test_an_unreadable_record_in_the_offsets_is_skipped_live_and_in_replay(
    tmp_path: Path,
) -> None:
    """A record that is no offset (an earlier release let clients produce there) neither
    fails the append nor the replay of the log, and is no offset."""
    from partition_service.log.group_offsets import encode_offset_record

    engine = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
    assert engine.groups is not None
    good = (*encode_offset_record("g", "in", 0, 8, None), None, NOW)
    bad = [("x", "y", None, NOW), (None, None, None, NOW), ('["g", "in", 1]', "[1]", None, NOW),
           ('["g", "in", 2]', '{"offset": "many"}', None, NOW)]  # fmt: skip
    engine.append_data([*bad, good], now_ms=NOW)
    assert engine.groups.offsets("g") == {("in", 0): (8, None)}
    engine.mark_durable(engine.log_end_offset)
    engine.close()
    (tmp_path / "o" / CHECKPOINT_FILE).unlink(missing_ok=True)
    reopened = open_engine(tmp_path / "o", SMALL, topic="__consumer_offsets")
    assert reopened.groups is not None
    assert reopened.groups.offsets("g") == {("in", 0): (8, None)}


def test_marker_for_unknown_producer_fences_a_late_first_batch(tmp_path: Path) -> None:
    """The KIP-890 race: a batch verified just before a fencing abort reaches the node."""
    engine = open_engine(tmp_path / "p")
    marker(engine, 4, 1, "ABORT")  # the coordinator timed the transaction out, epoch 0 -> 1
    with pytest.raises(errors.ProducerFencedError):
        produce(engine, ["late"], pid=4, epoch=0, seq=0, txn=True)
    assert engine.last_stable_offset == engine.high_watermark
    engine.close()
    reopened = open_engine(tmp_path / "p")
    with pytest.raises(errors.ProducerFencedError):
        produce(reopened, ["late"], pid=4, epoch=0, seq=0, txn=True)


def test_idle_producers_expire_but_open_transactions_stay(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=8192, index_interval_bytes=256, producer_expiration_ms=1000)
    engine = open_engine(tmp_path / "p", config)
    produce(engine, ["idle"], pid=1, epoch=0, seq=0)
    produce(engine, ["open"], pid=2, epoch=0, seq=0, txn=True)
    assert engine.expire_producers(NOW + 500) == []
    assert engine.expire_producers(NOW + 5000) == [1]
    assert set(engine.producers.producers) == {2}
    with pytest.raises(errors.UnknownProducerIdError):  # its next batch is no longer known
        produce(engine, ["again"], pid=1, epoch=0, seq=1)
    engine.write_checkpoint(engine.capture_checkpoint())
    engine.close()
    assert set(open_engine(tmp_path / "p", config).producers.producers) == {2}
