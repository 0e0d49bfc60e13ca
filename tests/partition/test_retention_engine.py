"""Retention and compaction on real log files, without a server: the deletion rule, its
bounds (high watermark, LSO, the active segment), the trimming of the aborted-transaction
index and of producer state, the log start surviving a restart, a follower restarting at
its leader's log start, and the compaction of ``__consumer_offsets``."""

from __future__ import annotations

from pathlib import Path

import pytest

from eos_protocol import errors
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from partition_service.log.cleaner import (
    RetentionPolicy,
    SegmentView,
    apply_retention,
    compact_offsets,
    follow_leader_start,
    retention_cut,
)
from partition_service.log.engine import PartitionEngine
from partition_service.log.group_offsets import encode_offset_record
from partition_service.log.log import LogConfig
from tests.partition.engine_support import NOW, marker, open_engine, produce, values

pytestmark = pytest.mark.unit

TINY = LogConfig(segment_bytes=4096, index_interval_bytes=256)
HOUR = 3_600_000


def fill(engine: PartitionEngine, batches: int, *, prefix: str = "v") -> None:
    for i in range(batches):
        produce(engine, [f"{prefix}{i}-" + "x" * 300])


def views(*specs: tuple[int, int, int]) -> list[SegmentView]:
    """Segments of (size, newest time, record count) laid end to end from offset 0."""
    out, base = [], 0
    for size, newest, count in specs:
        out.append(SegmentView(base, base + count, size, newest))
        base += count
    return out


# -- the rule on its own ---------------------------------------------------------------
def test_time_rule_deletes_expired_head_segments_and_stops_at_the_first_kept() -> None:
    closed = views((100, NOW - 3 * HOUR, 10), (100, NOW - 2 * HOUR, 10), (100, NOW, 10),
                   (100, NOW - 5 * HOUR, 10))  # fmt: skip
    cut = retention_cut(closed, total_bytes=500, policy=RetentionPolicy(ms=HOUR), now_ms=NOW,
                        bound=10**9)  # fmt: skip
    assert cut == 20  # the fourth is older, but the third is kept, so the pass stops there


def test_size_rule_never_cuts_below_the_limit() -> None:
    closed = views((100, NOW, 10), (100, NOW, 10), (100, NOW, 10))
    policy = RetentionPolicy(bytes=250)
    # the log is 400 bytes with its active segment: dropping one leaves 300, two leave 200
    assert retention_cut(closed, total_bytes=400, policy=policy, now_ms=NOW, bound=10**9) == 10
    assert retention_cut(closed, total_bytes=300, policy=policy, now_ms=NOW, bound=10**9) is None


def test_bound_stops_deletion_and_unlimited_deletes_nothing() -> None:
    closed = views((100, 0, 10), (100, 0, 10))
    policy = RetentionPolicy(ms=1)
    assert retention_cut(closed, total_bytes=300, policy=policy, now_ms=NOW, bound=15) == 10
    assert retention_cut(closed, total_bytes=300, policy=policy, now_ms=NOW, bound=9) is None
    unlimited = RetentionPolicy()
    assert retention_cut(closed, total_bytes=300, policy=unlimited, now_ms=NOW, bound=99) is None


# -- on real files ---------------------------------------------------------------------
def test_retention_deletes_whole_closed_segments_never_the_active_one(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    fill(engine, 60)
    assert len(engine.log.segments) > 3
    active = engine.log.active.path
    result = apply_retention(engine, RetentionPolicy(ms=HOUR), NOW + 2 * HOUR)
    assert result.deleted and engine.log.segments == [engine.log.active]
    assert active.exists() and engine.log_start_offset == engine.log.active.base_offset
    assert sorted(p.name for p in (tmp_path / "p").glob("*.log")) == [active.name]
    with pytest.raises(errors.OffsetOutOfRangeError):
        engine.read(0, max_records=10, max_bytes=1 << 20, read_committed=False)
    assert values(engine, committed=True, start=engine.log_start_offset)


def test_nothing_is_deleted_while_records_are_young_or_above_the_high_watermark(
    tmp_path: Path,
) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    fill(engine, 60)
    assert not apply_retention(engine, RetentionPolicy(ms=HOUR), NOW + HOUR // 2).deleted
    engine.durable_offset = 0  # as if nothing were durable yet
    assert not apply_retention(engine, RetentionPolicy(ms=HOUR), NOW + 2 * HOUR).deleted
    assert engine.log_start_offset == 0


def test_an_open_transaction_pins_its_segments_until_its_marker(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    produce(engine, ["open-" + "x" * 300], pid=7, epoch=0, seq=0, txn=True)
    fill(engine, 60)
    policy = RetentionPolicy(ms=HOUR)
    assert not apply_retention(engine, policy, NOW + 2 * HOUR).deleted  # LSO is 0
    marker(engine, 7, 0, "ABORT")
    assert apply_retention(engine, policy, NOW + 2 * HOUR).deleted
    assert engine.log_start_offset > 0


def test_the_aborted_index_is_trimmed_with_the_segments_and_producers_outlive_them(
    tmp_path: Path,
) -> None:
    """The aborts below the log start go with their segments. Producers do not (Kafka since
    KIP-360): an idle idempotent producer whose batches were all deleted goes on at its next
    sequence, and is forgotten only once idle for ``producer_expiration_ms``."""
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256, producer_expiration_ms=HOUR)
    engine = open_engine(tmp_path / "p", config)
    produce(engine, ["gone"], pid=1, epoch=0, seq=0, txn=True)
    marker(engine, 1, 0, "ABORT")
    produce(engine, ["idempotent"], pid=2, epoch=0, seq=0)
    fill(engine, 40)
    produce(engine, ["late"], pid=3, epoch=0, seq=0, txn=True)  # still open at the end
    assert len(engine.aborted) == 1 and set(engine.producers.producers) == {1, 2, 3}
    engine.durable_offset = engine.log_end_offset
    # the LSO is pid 3's first offset: everything before its segment may go
    result = apply_retention(engine, RetentionPolicy(ms=HOUR), NOW + 2 * HOUR)
    assert result.deleted and engine.log_start_offset > 1
    assert len(engine.aborted) == 0
    assert set(engine.producers.producers) == {1, 2, 3}
    with pytest.raises(errors.OutOfOrderSequenceNumberError):  # its sequence is still known
        produce(engine, ["gap"], pid=2, epoch=0, seq=5)
    again = produce(engine, ["again"], pid=2, epoch=0, seq=1)
    assert again.base_offset == engine.log_end_offset - 1
    engine.write_checkpoint(engine.capture_checkpoint())
    reopened = _reopen(engine)
    assert len(reopened.aborted) == 0 and set(reopened.producers.producers) == {1, 2, 3}
    # idle past the expiration (pid 2 wrote again at NOW): only the open one stays
    assert set(reopened.expire_producers(NOW + 2 * HOUR)) == {1, 2}
    assert set(reopened.producers.producers) == {3}


def test_log_start_survives_a_restart(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    fill(engine, 60)
    apply_retention(engine, RetentionPolicy(bytes=4096 * 3), NOW)
    start = engine.log_start_offset
    assert start > 0
    reopened = _reopen(engine)
    assert reopened.log_start_offset == start
    assert reopened.log_end_offset == engine.log_end_offset


def test_a_follower_deletes_below_its_leader_start_even_inside_a_segment(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    fill(engine, 60)
    inside = engine.log.segment_end(1) + 1  # one past the base of the third segment
    follow_leader_start(engine, inside)
    assert engine.log_start_offset == inside
    assert engine.log.segments[0].base_offset == inside - 1
    assert _reopen(engine).log_start_offset == inside  # persisted, not read off the files


def test_a_follower_behind_its_leader_start_restarts_there(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "p", TINY)
    fill(engine, 3)
    engine.restart_at(500)
    assert (engine.log_start_offset, engine.log_end_offset) == (500, 500)
    assert [s.base_offset for s in engine.log.segments] == [500]
    reopened = _reopen(engine)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 500)


def _reopen(engine: PartitionEngine) -> PartitionEngine:
    engine.close()
    return open_engine(engine.directory, engine.config, engine.topic)


# -- compaction of __consumer_offsets --------------------------------------------------
def commit(engine: PartitionEngine, group: str, partition: int, offset: int, **txn: int) -> None:
    key, value = encode_offset_record(group, "orders", partition, offset, None)
    if txn:
        seq = txn["seq"]
        engine.append_data([(key, value, None, NOW)], now_ms=NOW, producer_id=txn["pid"],
                           producer_epoch=0, base_sequence=seq, transactional=True)  # fmt: skip
    else:
        engine.append_data([(key, value, None, NOW)], now_ms=NOW)
    engine.mark_durable(engine.log_end_offset)


def compact_fully(engine: PartitionEngine) -> None:
    for _ in range(50):
        result = compact_offsets(engine, NOW)
        engine.mark_durable(engine.log_end_offset)
        if not result.deleted and not result.copied:
            return


def test_compaction_keeps_the_latest_offset_of_every_group_and_partition(
    tmp_path: Path,
) -> None:
    engine = open_engine(tmp_path / "o", TINY, topic=CONSUMER_OFFSETS_TOPIC)
    assert engine.groups is not None
    commit(engine, "quiet", 0, 7)  # committed once, never again
    for i in range(400):
        commit(engine, "busy", i % 3, i)
    marker(engine, 99, 0, "ABORT")  # unrelated marker
    commit(engine, "txn", 0, 1000, pid=5, seq=0)
    marker(engine, 5, 0, "ABORT")  # an aborted commit may go
    before = len(engine.log.segments)
    expected = {g: engine.groups.offsets(g) for g in ("quiet", "busy", "txn")}
    compact_fully(engine)
    assert len(engine.log.segments) < before / 2
    assert engine.log_start_offset > 0
    for group, offsets in expected.items():
        assert engine.groups.offsets(group) == offsets
    # without the checkpoint, the files alone must rebuild the same view
    engine.close()
    (engine.directory / "checkpoint.json").unlink(missing_ok=True)
    rebuilt = open_engine(engine.directory, engine.config, engine.topic)
    assert rebuilt.groups is not None
    for group, offsets in expected.items():
        assert rebuilt.groups.offsets(group) == offsets
    assert rebuilt.groups.offsets("quiet")[("orders", 0)] == (7, None)


def test_compaction_never_loses_a_pending_transactional_commit(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "o", TINY, topic=CONSUMER_OFFSETS_TOPIC)
    assert engine.groups is not None
    commit(engine, "g", 0, 1)
    commit(engine, "g", 0, 50, pid=5, seq=0)  # pending until its marker
    for i in range(300):
        commit(engine, "other", 0, i)
    compact_fully(engine)
    assert engine.log_start_offset <= engine.last_stable_offset
    marker(engine, 5, 0, "COMMIT")
    assert engine.groups.offsets("g")[("orders", 0)] == (50, None)
    compact_fully(engine)
    (engine.directory / "checkpoint.json").unlink(missing_ok=True)
    rebuilt = _reopen(engine)
    assert rebuilt.groups is not None
    assert rebuilt.groups.offsets("g")[("orders", 0)] == (50, None)
    assert rebuilt.groups.offsets("other")[("orders", 0)] == (299, None)
