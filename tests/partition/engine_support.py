"""Helpers for driving a PartitionEngine directly in tests."""

from __future__ import annotations

from pathlib import Path

from partition_service.log.engine import AppendResult, PartitionEngine, Row
from partition_service.log.log import LogConfig

NOW = 1_700_000_000_000
SMALL = LogConfig(segment_bytes=8192, index_interval_bytes=256)


def open_engine(directory: Path, config: LogConfig = SMALL, topic: str = "t") -> PartitionEngine:
    engine = PartitionEngine(directory, topic, 0, config)
    engine.open()
    return engine


def produce(
    engine: PartitionEngine,
    values: list[str],
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    txn: bool = False,
) -> AppendResult:
    rows: list[Row] = [(f"k{i}", v, None, NOW) for i, v in enumerate(values)]
    result = engine.append_data(
        rows,
        now_ms=NOW,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
    )
    engine.mark_durable(engine.log_end_offset)
    return result


def marker(
    engine: PartitionEngine, pid: int, epoch: int, result: str, coord_epoch: int = 0
) -> None:
    engine.append_marker(pid, epoch, coord_epoch, result, now_ms=NOW)
    engine.mark_durable(engine.log_end_offset)


def values(engine: PartitionEngine, *, committed: bool, start: int = 0) -> list[str]:
    """Every value readable from ``start``, following next_offset like a consumer."""
    out: list[str] = []
    offset = start
    upper = engine.last_stable_offset if committed else engine.high_watermark
    while offset < upper:
        result = engine.read(offset, max_records=7, max_bytes=1 << 20, read_committed=committed)
        assert result.next_offset > offset, "a read must always make progress"
        out.extend(str(r["value"]) for r in result.records)
        offset = result.next_offset
    return out
