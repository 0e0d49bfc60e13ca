"""Group commit of group state writes: many heartbeats' changes in one database transaction.

A heartbeat that changes a group (a join, a revocation acknowledged, an epoch moved on)
must be durable before it is answered. Written one by one under the group's lock, a
thousand members joining at once wait for a thousand fsyncs in a row: about 50 changes a
second on SQLite, slower than members time out. So a change is made in memory under the
lock, its rows are queued here, the lock is released, and the heartbeat waits for its
write; one flusher writes everything queued so far in one transaction, in the order it
was queued, and answers every waiter.

Why answering in this order is safe: a heartbeat's answer may rest on changes queued
before its own (a partition another member released); those are in the same batch or an
earlier one, so they are durable once its own write is. A write whose lease has moved on
writes nothing and fails, and so does every later write under the same lease in its
batch: the coordinator drops the group from memory and answers NOT_COORDINATOR, as it
does for a single write.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.groups import store
from coordinator_service.groups.membership import Group
from coordinator_service.transactions.store import LeaseToken


@dataclass
class GroupWrite:
    """The rows one change leaves behind, taken when it was made."""

    token: LeaseToken
    group_id: str
    group_row: dict[str, Any] | None  # None: the group is deleted
    members: list[dict[str, Any]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    done: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop()
                                       .create_future())


def snapshot(token: LeaseToken, group: Group, members: set[str], removed: set[str]
             ) -> GroupWrite:
    return GroupWrite(
        token, group.group_id, store.group_values(group),
        [store.member_values(group.group_id, group.members[m]) for m in sorted(members)
         if m in group.members],
        sorted(set(removed) | (set(members) - set(group.members))),
    )


def _write_batch(conn: Connection, writes: list[GroupWrite], now_ms: int) -> list[bool]:
    held: dict[LeaseToken, bool] = {}
    for w in writes:
        if w.token not in held:
            held[w.token] = store.holds_lease(conn, w.token, now_ms)
    for w in writes:
        if held[w.token]:
            store.write_rows(conn, w.group_id, w.group_row, w.members, w.removed, now_ms)
    return [held[w.token] for w in writes]


class GroupWriter:
    """One flusher per coordinator; ``submit`` queues, the flusher writes in batches."""

    def __init__(self, db: Database, lease_clock: Clock) -> None:
        self._db = db
        self._clock = lease_clock
        self._queue: list[GroupWrite] = []
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, write: GroupWrite) -> asyncio.Future[bool]:
        """Queue ``write``; the future says whether it was written (False: the lease had
        moved on) or carries the database's error."""
        self._queue.append(write)
        self._wanted.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="group writes")
        return write.done

    async def _run(self) -> None:
        while self._queue:
            self._wanted.clear()
            batch, self._queue = self._queue, []
            try:
                results = await self._db.run(_write_batch, batch, self._clock.now_ms())
            except Exception as exc:  # the database is away: every waiter hears it
                for w in batch:
                    if not w.done.done():
                        w.done.set_exception(exc)
                continue
            for w, ok in zip(batch, results, strict=True):
                if not w.done.done():
                    w.done.set_result(ok)

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            with contextlib.suppress(Exception):
                await task
