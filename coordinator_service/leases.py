"""Ownership of transaction-log partitions through lease rows.

Each of the ``txn_log_partitions`` partitions has one row in ``leases``. An instance owns a
partition while its row names it and ``expires_at_ms`` lies ahead; it renews every third of
the lease time. A row whose lease has run out may be taken by anyone: the taker bumps the
``coordinator_epoch`` with a compare-and-set on the epoch it read, loads the partition's
records and resumes their unfinished markers. Every state write carries ``(partition,
owner, epoch)`` and checks it in SQL (``transactions/store.py``), so an instance that
stopped renewing — paused, partitioned, or slow — can no longer change anything once
another has taken over.

On a clean shutdown an instance releases its leases (expiry set to 0) so a survivor takes
over at its next round instead of after the lease time.

The manager also remembers, by its own lease clock, until when each lease is certainly
still this instance's (``live_token``): the expiry it last wrote, less a safety margin for
clock skew between instances. Reads served from memory instead of the database (KIP-890's
verification) rely on that; writes never do, they are fenced in SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import leases
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions.store import LeaseToken
from eos_protocol.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)

log = logging.getLogger("eos.coordinator.leases")


@dataclass(frozen=True)
class LeaseOwner:
    owner: str | None
    url: str | None
    node_id: int | None
    coordinator_epoch: int
    alive: bool


def ensure_lease_rows(conn: Connection, count: int) -> None:
    serialize_first_start(conn)
    existing = {r[0] for r in conn.execute(sa.select(leases.c.log_partition))}
    missing = [{"log_partition": p} for p in range(count) if p not in existing]
    if missing:
        conn.execute(leases.insert(), missing)


def read_owner(conn: Connection, log_partition: int, now_ms: int) -> LeaseOwner:
    row = conn.execute(sa.select(leases).where(leases.c.log_partition == log_partition)).first()
    if row is None:
        return LeaseOwner(None, None, None, 0, False)
    m = row._mapping
    alive = m["owner"] is not None and m["expires_at_ms"] > now_ms
    return LeaseOwner(
        m["owner"], m["owner_url"], m["owner_node_id"], m["coordinator_epoch"], alive
    )


class LeaseManager:
    """Acquires, renews and gives up this instance's leases; knows what it owns."""

    def __init__(
        self,
        db: Database,
        *,
        instance_id: str,
        url: str,
        node_id: int,
        partitions: int,
        lease_ms: int,
        renew_interval_ms: int,
        clock: Clock,
        on_acquired: Callable[[LeaseToken], Awaitable[None]],
        on_lost: Callable[[int], Awaitable[None]],
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        self._db = db
        self._metrics = metrics or CoordinatorMetrics()
        self.instance_id = instance_id
        self._url = url
        self._node_id = node_id
        self._partitions = partitions
        self._lease_ms = lease_ms
        self._renew_interval_s = renew_interval_ms / 1000
        self._clock = clock
        self._on_acquired = on_acquired
        self._on_lost = on_lost
        self.owned: dict[int, int] = {}
        # log partition -> lease-clock time until which the lease is certainly ours
        self._valid_until: dict[int, int] = {}
        self._margin_ms = lease_ms // 4
        self.loading: set[int] = set()
        self.ready = False
        self._round_lock = asyncio.Lock()
        self._foreign_expiry: int | None = None

    # --- queries -------------------------------------------------------------------------

    def token(self, log_partition: int) -> LeaseToken | None:
        epoch = self.owned.get(log_partition)
        if epoch is None:
            return None
        return LeaseToken(log_partition, self.instance_id, epoch)

    def live_token(self, log_partition: int) -> LeaseToken | None:
        """The token of a lease that cannot have passed to another instance yet.

        ``None`` once the local lease clock reaches the expiry this instance last wrote,
        less a quarter of the lease time for clock skew; a renewal every third of the
        lease time keeps a healthy lease well inside that window. Callers fall back to the
        database when this gives ``None``.
        """
        token = self.token(log_partition)
        if token is None:
            return None
        until = self._valid_until.get(log_partition, 0)
        if self._clock.now_ms() >= until - self._margin_ms:
            return None
        return token

    async def require(self, log_partition: int) -> LeaseToken:
        """The lease for a request on this partition, or the retriable error to answer."""
        token = self.token(log_partition)
        if token is not None:
            return token
        if log_partition in self.loading or not self.ready:
            raise CoordinatorLoadInProgressError(
                f"transaction log partition {log_partition} is loading"
            )
        owner = await self.owner(log_partition)
        if owner.alive and owner.owner == self.instance_id:  # taken, but could not be loaded
            raise CoordinatorNotAvailableError(
                f"transaction log partition {log_partition} is not available here; retry"
            )
        if owner.alive and owner.url:
            raise NotCoordinatorError(
                f"transaction log partition {log_partition} is owned by {owner.url}",
                details={"coordinator_url": owner.url, "node_id": owner.node_id},
            )
        raise CoordinatorNotAvailableError(
            f"transaction log partition {log_partition} has no live owner; retry shortly"
        )

    async def owner(self, log_partition: int) -> LeaseOwner:
        return await self._db.run(read_owner, log_partition, self._clock.now_ms())

    # --- the renew / acquire round -------------------------------------------------------

    def _renew(self, conn: Connection, owned: dict[int, int], now: int) -> list[int]:
        """Extend the leases still ours; the partitions whose row moved on.

        Rows are taken in ascending order, as every other transaction that locks several
        lease rows does (acquisition, release, batches of state writes): no deadlocks.
        """
        lost: list[int] = []
        for p, epoch in sorted(owned.items()):
            result = conn.execute(
                leases.update()
                .where(
                    leases.c.log_partition == p,
                    leases.c.owner == self.instance_id,
                    leases.c.coordinator_epoch == epoch,
                )
                .values(expires_at_ms=now + self._lease_ms)
            )
            if result.rowcount != 1:
                lost.append(p)
        return lost

    def _next_foreign_expiry(self, conn: Connection, now: int) -> int | None:
        """When the soonest lease held by another instance runs out (None if none does)."""
        soonest = conn.execute(
            sa.select(sa.func.min(leases.c.expires_at_ms))
            .where(leases.c.owner.is_not(None), leases.c.owner != self.instance_id)
            .where(leases.c.expires_at_ms > now)
            .where(leases.c.log_partition < self._partitions)
        ).scalar()
        return None if soonest is None else int(soonest)

    def _acquire(self, conn: Connection, now: int) -> list[tuple[int, int]]:
        self._foreign_expiry = self._next_foreign_expiry(conn, now)
        free = conn.execute(
            sa.select(leases.c.log_partition, leases.c.coordinator_epoch)
            .where(sa.or_(leases.c.owner.is_(None), leases.c.expires_at_ms <= now))
            .where(leases.c.log_partition < self._partitions)
            .order_by(leases.c.log_partition)
        ).all()
        taken: list[tuple[int, int]] = []
        for row in free:
            p, epoch = int(row.log_partition), int(row.coordinator_epoch)
            result = conn.execute(
                leases.update()
                .where(
                    leases.c.log_partition == p,
                    leases.c.coordinator_epoch == epoch,
                    sa.or_(leases.c.owner.is_(None), leases.c.expires_at_ms <= now),
                )
                .values(
                    owner=self.instance_id,
                    owner_url=self._url,
                    owner_node_id=self._node_id,
                    coordinator_epoch=epoch + 1,
                    expires_at_ms=now + self._lease_ms,
                )
            )
            if result.rowcount == 1:
                taken.append((p, epoch + 1))
        return taken

    async def run_round(self) -> None:
        """Renew what we own, drop what we lost, take what is free and load it."""
        async with self._round_lock:
            now = self._clock.now_ms()
            renewing = dict(self.owned)
            lost = await self._db.run(self._renew, renewing, now)
            for p in renewing:
                if p not in lost and self.owned.get(p) == renewing[p]:
                    self._valid_until[p] = now + self._lease_ms
            for p in lost:
                await self.drop(p)
            taken = await self._db.run(self._acquire, now)
            self.loading.update(p for p, _ in taken)
            for p, epoch in taken:
                try:
                    await self._on_acquired(LeaseToken(p, self.instance_id, epoch))
                except Exception:
                    # One partition that cannot be loaded (a record that does not read) must
                    # not keep the partitions after it from being loaded. Its lease is left
                    # to run out unrenewed, and it is taken and loaded again after that.
                    self._metrics.set_aside.labels(loop="leases").inc()
                    log.exception("transaction log partition %d could not be loaded; "
                                  "trying again when its lease runs out", p)
                    with contextlib.suppress(Exception):
                        await self._on_lost(p)  # drop whatever part of it was loaded
                    continue
                else:
                    self.owned[p] = epoch
                    self._valid_until[p] = now + self._lease_ms
                    log.info("took transaction log partition %d at coordinator epoch %d", p, epoch)
                finally:
                    self.loading.discard(p)

    async def drop(self, log_partition: int) -> None:
        """Forget a partition whose lease has moved on (found by renewal or a failed write)."""
        self._valid_until.pop(log_partition, None)
        if self.owned.pop(log_partition, None) is not None:
            log.warning("lost transaction log partition %d", log_partition)
            await self._on_lost(log_partition)

    async def start(self) -> None:
        await self._db.run(ensure_lease_rows, self._partitions)
        await self.run_round()
        self.ready = True

    def next_round_in_s(self) -> float:
        """Until the next round: the renewal interval, or sooner when another instance's
        lease runs out before then, so a dead owner's partitions are taken as soon as its
        lease allows rather than up to a renewal interval later."""
        wait = self._renew_interval_s
        if self._foreign_expiry is not None:
            until_free = (self._foreign_expiry - self._clock.now_ms() + 5) / 1000
            wait = min(wait, max(0.01, until_free))
        return wait

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.next_round_in_s())
            try:
                await self.run_round()
            except Exception:  # the database may be away for a while: try again next round
                log.exception("lease round failed")

    async def release_all(self) -> None:
        owned = dict(self.owned)
        self.owned.clear()
        self._valid_until.clear()

        def release(conn: Connection) -> None:
            for p, epoch in sorted(owned.items()):
                conn.execute(
                    leases.update()
                    .where(
                        leases.c.log_partition == p,
                        leases.c.owner == self.instance_id,
                        leases.c.coordinator_epoch == epoch,
                    )
                    .values(expires_at_ms=0)
                )

        if owned:
            await self._db.run(release)
