"""Where the group committer runs a partition's fsync (partition_service/group_commit.py):
on the event loop while the disk syncs quickly, on a worker thread once it does not."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from partition_service.group_commit import Durability, GroupCommitter
from partition_service.log.engine import PartitionEngine
from tests.partition.engine_support import NOW, open_engine

pytestmark = pytest.mark.unit


class TimedDisk:
    """The engine's fsync, made as slow as asked, noting the thread each ran on."""

    def __init__(self, engine: PartitionEngine) -> None:
        self.on_loop: list[bool] = []
        self.delay_s = 0.0
        self._fsync = engine.fsync
        engine.fsync = self.fsync  # type: ignore[method-assign]

    def fsync(self) -> None:
        self.on_loop.append(threading.current_thread() is threading.main_thread())
        time.sleep(self.delay_s)
        self._fsync()


async def _round(engine: PartitionEngine, committer: GroupCommitter) -> None:
    """One append made durable by a round of its own."""
    engine.append_data([("k", "v", None, NOW)], now_ms=NOW)
    await committer.wait_durable(engine.log_end_offset)
    assert engine.durable_offset == engine.log_end_offset


def _drive(
    engine: PartitionEngine,
    inline_under_us: int,
    script: Callable[[GroupCommitter, TimedDisk], Awaitable[None]],
) -> list[bool]:
    """Run ``script`` against a started committer; for each of its fsyncs, whether it ran
    on the loop (the committer's last flush at stop, always on the loop, left out)."""
    disk = TimedDisk(engine)
    rounds: list[bool] = []

    async def main() -> None:
        durability = Durability(
            fsync=True, checkpoint_interval_ms=5000, inline_fsync_under_us=inline_under_us
        )
        committer = GroupCommitter(engine, durability, on_durable=lambda: None)
        committer.start()
        try:
            await script(committer, disk)
        finally:
            rounds.extend(disk.on_loop)
            await committer.stop()

    asyncio.run(main())
    engine.close()
    return rounds


def test_quick_fsyncs_run_on_the_loop_and_a_slow_one_sends_the_next_to_a_thread(
    tmp_path: Path,
) -> None:
    engine = open_engine(tmp_path / "t-0")

    async def script(committer: GroupCommitter, disk: TimedDisk) -> None:
        await _round(engine, committer)  # the disk is not known yet: a thread
        await _round(engine, committer)  # quick so far: the loop
        disk.delay_s = 0.3
        await _round(engine, committer)  # decided before it was slow: the loop
        disk.delay_s = 0.0
        await _round(engine, committer)  # after a slow one: a thread
        for _ in range(20):
            await _round(engine, committer)
            if disk.on_loop[-1]:
                break
        assert committer.fsyncs == len(disk.on_loop)
        assert committer.inline_fsyncs == sum(disk.on_loop)

    rounds = _drive(engine, 50_000, script)
    assert rounds[:4] == [False, True, True, False]
    assert rounds[-2:] == [False, True]  # quick again, back on the loop


def test_with_no_bound_every_fsync_runs_on_a_thread(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "t-0")

    async def script(committer: GroupCommitter, _disk: TimedDisk) -> None:
        for _ in range(5):
            await _round(engine, committer)

    assert _drive(engine, 0, script) == [False] * 5
