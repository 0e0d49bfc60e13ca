"""Group commit: one fsync makes many concurrent appends durable at once.

Producers append (a cheap write to the page cache) and then wait here for their last
offset to become durable. A single flusher task per partition loops: it notes the log end,
fsyncs (see below for where), then releases every waiter up to that end. Requests that
arrive during a round share the next one, so the cost of durability is paid per round, not
per request. The same loop writes the partition's checkpoint now and then, always for a
state that the fsync it follows has made durable.

Where the fsync runs is chosen round by round. Handing it to a worker thread costs the
event loop a thread wake-up, a hand-back through the loop's self-pipe and the interpreter
lock passing twice: measured on a virtual disk that syncs in 0.2 ms (``python -m
eos_bench.suite_scale --instances 1 --flow v2``), that hand-off was a fifth of the node's
CPU per transaction. So while the partition's recent fsyncs are quick (a moving average
under ``Durability.inline_fsync_under_us``) the loop calls fsync itself, as Redis does with
``appendfsync always``; the first slow one moves the next rounds to a worker thread, where
the loop stays free for as long as the disk takes, and they come back once the disk is quick
again. ``inline_fsync_under_us=0`` keeps every fsync on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from eos_protocol.errors import KafkaStorageError, UnknownTopicOrPartitionError
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import Checkpoint

log = logging.getLogger("eos.node.durability")


#: Weight of the latest fsync in the moving average that picks where the next one runs.
FSYNC_AVERAGE_WEIGHT = 0.2


@dataclass(frozen=True)
class Durability:
    """How a node makes its partitions' appends durable (from the node's settings, which
    hold the defaults)."""

    fsync: bool
    checkpoint_interval_ms: int
    # fsyncs run on the event loop while their moving average is under this (0: never)
    inline_fsync_under_us: int


class GroupCommitter:
    def __init__(
        self,
        engine: PartitionEngine,
        durability: Durability,
        *,
        on_durable: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.fsync_enabled = durability.fsync
        self.checkpoint_interval_s = durability.checkpoint_interval_ms / 1000
        self.inline_under_s = durability.inline_fsync_under_us / 1_000_000
        # starts at the bound: the first rounds run on a thread and measure the disk
        self.recent_fsync_s = self.inline_under_s
        self._on_durable = on_durable
        self._wakeup = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._idle = False  # the loop waits for an append, with no timer
        self._last_checkpoint_at = time.monotonic()
        self._checkpointed_offset = -1
        self.failed: BaseException | None = None
        self.abandoned: str | None = None  # why nothing more is made durable (deleted)
        self.fsyncs = 0
        self.inline_fsyncs = 0

    def start(self) -> None:
        self._checkpointed_offset = self.engine.log_end_offset
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        """Flush what is pending, write a final checkpoint and end the loop."""
        await self.stop_loop()
        target = self.final_flush()
        self._release(target)

    async def stop_loop(self) -> None:
        """End the loop; what is pending stays for ``final_flush``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def final_flush(self) -> int:
        """Flush what is pending and write a final checkpoint, once the loop has ended;
        the offset now durable, whose waiters the caller releases on the event loop
        (``release``). Touches only this partition's files and state, so a node stopping
        runs it for its partitions side by side on threads."""
        if self.failed is not None:
            return self.engine.durable_offset
        target = self.engine.log_end_offset
        self.engine.fsync()
        self.engine.mark_durable(target)
        self._write_checkpoint(self.engine.capture_checkpoint())
        return target

    def release(self, target: int) -> None:
        """Settle the waiters of offsets below ``target`` (on the event loop)."""
        self._release(target)

    def abandon(self, why: str) -> None:
        """Make nothing more durable, once the loop has ended (``stop_loop``): the
        partition is deleted, its files about to go. Every waiter, and every later wait,
        is answered UNKNOWN_TOPIC_OR_PARTITION with ``why``: a batch not durable yet never
        will be, so it must not be acknowledged."""
        self.abandoned = why
        for _offset, future in self._waiters:
            if not future.done():
                future.set_exception(UnknownTopicOrPartitionError(why))
        self._waiters = []

    async def wait_durable(self, offset: int) -> None:
        """Return once every offset below ``offset`` is durable."""
        if self.failed is not None:
            raise KafkaStorageError(f"partition storage failed: {self.failed}")
        if self.abandoned is not None:
            raise UnknownTopicOrPartitionError(self.abandoned)
        if offset <= self.engine.durable_offset:
            return
        if not self.fsync_enabled:
            self.engine.mark_durable(self.engine.log_end_offset)
            self._on_durable()
            if self._idle:  # the loop sleeps with no timer: a checkpoint is due in time
                self._wakeup.set()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        self._wakeup.set()
        await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._wakeup.is_set():  # under load it is: no timer and task for this round
                await asyncio.sleep(0)  # but a round always lets the others run
            elif self.engine.log_end_offset == self._checkpointed_offset:
                # Idle, and the checkpoint holds the log: nothing is due until something
                # is appended (which wakes the loop), so no timer either. A node of 5,000
                # idle partitions woke 1,000 times a second to find nothing to do.
                self._idle = True
                try:
                    await self._wakeup.wait()
                finally:
                    self._idle = False
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wakeup.wait(), timeout=self.checkpoint_interval_s
                    )
            self._wakeup.clear()
            target = self.engine.log_end_offset
            pending = self._checkpoint_due(target)
            try:
                if target > self.engine.durable_offset:
                    if self.recent_fsync_s < self.inline_under_s:
                        took = self._timed_fsync()
                        self.inline_fsyncs += 1
                    else:  # the loop's executor, without ``to_thread``'s context copy
                        took = await loop.run_in_executor(None, self._timed_fsync)
                    self.recent_fsync_s += FSYNC_AVERAGE_WEIGHT * (took - self.recent_fsync_s)
                    self.fsyncs += 1
            except OSError as exc:
                self._fail(exc)
                return
            self.engine.mark_durable(target)
            self._release(target)
            self._on_durable()
            if pending is not None:
                self._write_checkpoint(pending)

    def _timed_fsync(self) -> float:
        started = time.perf_counter()
        self.engine.fsync()
        return time.perf_counter() - started

    def _checkpoint_due(self, target: int) -> Checkpoint | None:
        if target == self._checkpointed_offset:
            return None
        if time.monotonic() - self._last_checkpoint_at < self.checkpoint_interval_s:
            return None
        self.engine.expire_producers(int(time.time() * 1000))
        return self.engine.capture_checkpoint()

    def _write_checkpoint(self, checkpoint: Checkpoint) -> None:
        try:
            self.engine.write_checkpoint(checkpoint)
        except OSError:
            log.exception("checkpoint of %s failed", self.engine.directory)
            return
        self._last_checkpoint_at = time.monotonic()
        self._checkpointed_offset = checkpoint.next_offset

    def _flush_now(self) -> None:
        target = self.engine.log_end_offset
        self.engine.fsync()
        self.engine.mark_durable(target)
        self._release(target)

    def _release(self, target: int) -> None:
        still: list[tuple[int, asyncio.Future[None]]] = []
        for offset, future in self._waiters:
            if offset <= target:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((offset, future))
        self._waiters = still
        if still:
            self._wakeup.set()

    def _fail(self, exc: BaseException) -> None:
        log.error("fsync of %s failed: %s", self.engine.directory, exc)
        self.failed = exc
        for _offset, future in self._waiters:
            if not future.done():
                future.set_exception(KafkaStorageError(f"fsync failed: {exc}"))
        self._waiters = []
