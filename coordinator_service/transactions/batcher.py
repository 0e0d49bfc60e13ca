"""Group commit for the coordinator's state writes.

Each transition of a transactional id is one fenced write, durable before the request that
caused it is answered. Written one database transaction each, 32 producers cost a worker
thread hop, a round trip per statement and a commit (a WAL flush) per write. The batcher
lets every write that arrives while the database is busy wait for the next batch instead:
a worker takes everything queued, runs it through ``TransactionStore.write_many`` in one
transaction on one worker thread, commits once and then answers each caller with its own
outcome. Nothing is weakened:

* each write is still its own statement with the lease check in its WHERE clause, so each
  caller learns whether *its* lease still held (``False`` -> NOT_COORDINATOR for that id
  only, the others in the batch go on);
* a caller is answered only after the commit of the batch holding its write;
* writes of one transactional id keep their order: requests for an id are serialised by
  the coordinator's per-id lock, and within a batch statements run in queue order;
* if a batch fails (a connection lost mid-way, a bug in one write), its writes are tried
  again one transaction each so one bad write fails only its own caller.

How many batches may be in flight at once is ``concurrency`` (the coordinator's
``state_write_batches``, 1 by default): while one batch is out, the next gathers in the
queue. With the database on the same host one is the best: measured with
``python -m eos_bench.suite_scale --instances 1 --flow v2``, two batches in flight split the
writes over twice the commits and had the two threads contend for the interpreter lock,
for 10 to 20% fewer committed transactions per second and 15 to 25% more CPU per transaction
(at 32 producers: 0.27 database commits per transaction with one, 0.48 with two; three and
four were worse again). Where each round trip to the database costs a network hop,
sending the next batch while the previous one commits may pay for itself. Batches run on
threads of their own (``Database.transaction``, the same transaction owner as
``Database.run``): a plain executor's hand-off is cheaper than anyio's worker threads, and
a batch never waits behind the reads other requests run there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.transactions.state import TxnRecord
from coordinator_service.transactions.store import LeaseToken, TransactionStore

log = logging.getLogger("eos.coordinator.batcher")


@dataclass(eq=False)
class _Write:
    rec: TxnRecord
    token: LeaseToken
    insert: bool
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class WriteBatcher:
    """Queues fenced writes and makes them durable in shared database transactions."""

    def __init__(
        self,
        db: Database,
        store: TransactionStore,
        lease_clock: Clock,
        *,
        max_batch: int = 256,
        concurrency: int = 1,
    ) -> None:
        self._db = db
        self._store = store
        self._lease_clock = lease_clock
        self._max_batch = max_batch
        self._concurrency = concurrency
        self._queue: list[_Write] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._threads: ThreadPoolExecutor | None = None
        self.batches = 0
        self.writes = 0

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if not self._tasks:
            self._threads = ThreadPoolExecutor(self._concurrency, "state-writes")
            self._tasks = [
                asyncio.create_task(self._worker(), name=f"state-writes-{i}")
                for i in range(self._concurrency)
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        queued, self._queue = self._queue, []
        for w in queued:
            if not w.done.done():
                w.done.set_exception(RuntimeError("the coordinator is stopping"))

    # --- writing -------------------------------------------------------------------------

    async def write(self, rec: TxnRecord, token: LeaseToken, *, insert: bool) -> bool:
        """Make one record durable under ``token``; False when the lease has moved on."""
        return (await self.write_many([(rec, token, insert)]))[0]

    async def write_many(self, writes: list[tuple[TxnRecord, LeaseToken, bool]]) -> list[bool]:
        """Several writes, each fenced on its own, all durable when this returns."""
        if not writes:
            return []
        if not self._tasks:  # not started (tools and tests that drive the store directly)
            now = self._lease_clock.now_ms()
            return await self._db.run(self._store.write_many, writes, now)
        queued = [_Write(rec, token, insert) for rec, token, insert in writes]
        self._queue.extend(queued)
        self._wake.set()
        return list(await asyncio.gather(*(w.done for w in queued)))

    async def _worker(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            if self._queue:
                self._wake.set()  # let another worker gather the rest meanwhile
            await self._run(batch)

    async def _run(self, batch: list[_Write]) -> None:
        writes = [(w.rec, w.token, w.insert) for w in batch]
        try:
            # the lease clock is read when the batch goes out, as a single write reads it
            call = functools.partial(
                self._db.transaction, self._store.write_many, writes, self._lease_clock.now_ms()
            )
            oks = await asyncio.get_running_loop().run_in_executor(self._threads, call)
        except asyncio.CancelledError:
            for w in batch:
                if not w.done.done():
                    w.done.set_exception(RuntimeError("the coordinator is stopping"))
            raise
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0].done.done():
                    batch[0].done.set_exception(exc)
                return
            log.warning("a batch of %d state writes failed (%s); writing them one by one",
                        len(batch), exc)
            for w in batch:
                await self._run([w])
            return
        self.batches += 1
        self.writes += len(batch)
        for w, ok in zip(batch, oks, strict=True):
            if not w.done.done():
                w.done.set_result(ok)
