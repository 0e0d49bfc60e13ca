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

The partitions are shared evenly between the live instances (``lease_balance.py``): each
round an instance takes free partitions up to its fair share and hands over those above
it when another instance is short. A hand-over is graceful: requests for the partition
are answered ``NOT_COORDINATOR`` from then on (clients look the coordinator up again),
the requests already inside finish and its markers get a moment to complete (within a
quarter of the lease time, at most 2 s, so the round's other leases stay renewed), its
state is dropped from memory, and only then is the lease released; the taker loads the records
from the database and resumes whatever markers are still due. Writes stay fenced in SQL
throughout, so a step that runs late can change nothing.

Expiries are on the database's clock (``clock.DatabaseClock``, read again every round),
never an instance's own wall clock: a machine whose clock runs minutes ahead would take
every lease at once, one minutes behind would keep its own that long after it stopped.
The manager also remembers until when each lease is certainly still this instance's
(``live_token``): the expiry it last wrote, less a safety margin for the half round trip
by which the instances' readings of that clock may differ. Reads served from memory
instead of the database (KIP-890's verification) rely on that; writes never do, they are
fenced in SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock, DatabaseClock
from coordinator_service.cluster.lease_balance import LeasePicture, LeaseRow, RoundPlan, plan_round
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import coordinator_instances, leases
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions.store import LeaseToken
from eos_protocol.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)

log = logging.getLogger("eos.coordinator.leases")

#: How soon the next round comes while the shares are uneven (a partition released for
#: this instance is taken within this, not a renewal interval later).
_REBALANCE_POLL_S = 0.1

#: The most a hand-over waits for the partition's requests and markers in flight.
_HANDOFF_BUDGET_S = 2.0


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


def release_lease(conn: Connection, key: int, owner: str, epoch: int) -> None:
    """Let the lease row ``key`` run out now, if ``owner`` still holds it at ``epoch``: a
    clean shutdown hands it over at the next round of another instance, not after the
    lease time. Used for the transaction-log partitions and the controller's row alike."""
    conn.execute(
        leases.update()
        .where(
            leases.c.log_partition == key,
            leases.c.owner == owner,
            leases.c.coordinator_epoch == epoch,
        )
        .values(expires_at_ms=0)
    )


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
        on_handoff: Callable[[int, float], Awaitable[None]] | None = None,
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
        self._on_handoff = on_handoff or (lambda p, _budget: on_lost(p))
        self.owned: dict[int, int] = {}
        # partitions being handed over: refused with NOT_COORDINATOR until released
        self.leaving: set[int] = set()
        # partition -> lease-clock time until which a partition that failed to load is
        # left alone (it is taken again once its lease has run out, not at every round)
        self._set_aside: dict[int, int] = {}
        self.last_plan: RoundPlan | None = None
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
        if log_partition in self.leaving:
            raise NotCoordinatorError(
                f"transaction log partition {log_partition} is moving to another "
                "coordinator; look it up again"
            )
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
            .where(leases.c.log_partition >= 0, leases.c.log_partition < self._partitions)
        ).scalar()
        return None if soonest is None else int(soonest)

    def _picture(self, conn: Connection, now: int) -> LeasePicture:
        """Who holds what and who is alive, as this round's plan needs it."""
        rows = conn.execute(
            sa.select(leases.c.log_partition, leases.c.owner, leases.c.expires_at_ms)
            # rows below 0 are not transaction-log partitions (the controller's is -1)
            .where(leases.c.log_partition >= 0, leases.c.log_partition < self._partitions)
        ).all()
        beating = conn.execute(
            sa.select(coordinator_instances.c.instance_id).where(
                coordinator_instances.c.heartbeat_ms >= now - self._lease_ms // 2
            )
        ).scalars()
        return LeasePicture(
            me=self.instance_id,
            partitions=self._partitions,
            rows=tuple(
                LeaseRow(
                    int(r.log_partition),
                    r.owner,
                    r.owner is not None
                    and int(r.expires_at_ms) > now
                    and not self._reclaimable(int(r.log_partition), r.owner, now),
                )
                for r in rows
            ),
            beating=frozenset(str(b) for b in beating),
        )

    def _reclaimable(self, log_partition: int, owner: str | None, now: int) -> bool:
        """A live row naming this instance that it does not know it owns: left by an
        earlier process under the same ``--instance-id`` (a restart, a supervisor's child
        started again). It is taken back at once rather than after its lease runs out;
        the take bumps the epoch, so nothing that earlier process might still send can
        write. A partition set aside after a failed load waits out its lease instead."""
        return (
            owner == self.instance_id
            and log_partition not in self.owned
            and log_partition not in self.leaving
            and self._set_aside.get(log_partition, 0) <= now
        )

    def _acquire(self, conn: Connection, now: int, limit: int) -> list[tuple[int, int]]:
        """Take up to ``limit`` free partitions, lowest first, each by compare-and-set on
        the epoch read (another instance taking the same row makes ours a no-op)."""
        self._foreign_expiry = self._next_foreign_expiry(conn, now)
        if limit <= 0:
            return []
        free = conn.execute(
            sa.select(
                leases.c.log_partition, leases.c.coordinator_epoch, leases.c.owner,
                leases.c.expires_at_ms,
            )
            .where(sa.or_(
                leases.c.owner.is_(None), leases.c.expires_at_ms <= now,
                leases.c.owner == self.instance_id,
            ))
            .where(leases.c.log_partition >= 0, leases.c.log_partition < self._partitions)
            .order_by(leases.c.log_partition)
        ).all()
        taken: list[tuple[int, int]] = []
        for row in free:
            if len(taken) >= limit:
                break
            p, epoch = int(row.log_partition), int(row.coordinator_epoch)
            running = row.owner is not None and int(row.expires_at_ms) > now
            if running and not self._reclaimable(p, row.owner, now):
                continue
            result = conn.execute(
                leases.update()
                .where(
                    leases.c.log_partition == p,
                    leases.c.coordinator_epoch == epoch,
                    sa.or_(
                        leases.c.owner.is_(None), leases.c.expires_at_ms <= now,
                        leases.c.owner == self.instance_id,
                    ),
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

    async def hand_off(self, log_partitions: tuple[int, ...]) -> None:
        """Give partitions to whoever is short of them: refuse new requests, let the
        coordinator finish and unload each, then release its lease."""
        epochs = {p: self.owned[p] for p in log_partitions if p in self.owned}
        if not epochs:
            return
        self.leaving.update(epochs)
        for p in epochs:
            self.owned.pop(p, None)
            self._valid_until.pop(p, None)
        try:
            # The round waits for this, and the other leases were renewed at its start:
            # a quarter of the lease time leaves them well inside their expiry.
            budget = min(_HANDOFF_BUDGET_S, self._lease_ms / 4000)
            results = await asyncio.gather(
                *(self._on_handoff(p, budget) for p in epochs), return_exceptions=True
            )
            for p, result in zip(epochs, results, strict=True):
                if isinstance(result, BaseException):
                    log.error("hand-over of transaction log partition %d: %s", p, result)

            def release(conn: Connection) -> None:
                for p, epoch in sorted(epochs.items()):
                    release_lease(conn, p, self.instance_id, epoch)

            await self._db.run(release)
            self._metrics.lease_handoffs.inc(len(epochs))
            log.info("handed over transaction log partitions %s", sorted(epochs))
        finally:
            self.leaving.difference_update(epochs)

    async def run_round(self) -> None:
        """Renew what we own, drop what we lost, hand over what is above our share, take
        free partitions up to it and load them."""
        async with self._round_lock:
            if isinstance(self._clock, DatabaseClock):  # read again: one timeline for all
                await self._db.run(self._clock.sync)
            now = self._clock.now_ms()
            renewing = dict(self.owned)
            lost = await self._db.run(self._renew, renewing, now)
            for p in renewing:
                if p not in lost and self.owned.get(p) == renewing[p]:
                    self._valid_until[p] = now + self._lease_ms
            for p in lost:
                await self.drop(p)
            picture = await self._db.run(self._picture, now)
            plan = self.last_plan = plan_round(picture, self.owned)
            if plan.give:
                await self.hand_off(plan.give)
            taken = await self._db.run(self._acquire, now, plan.take)
            self.loading.update(p for p, _ in taken)
            # Loading is one partition after another, and on a loaded machine a round that
            # takes many (every partition of an instance that stopped) can outlast the lease
            # it renewed at its start: renewed again as it goes, no lease of this instance,
            # already held or just taken, runs out while the others load.
            written = now  # when the expiries were last written
            unloaded = dict(taken)
            gone: set[int] = set()  # taken here, and moved on before they were loaded
            renew_every_ms = self._renew_interval_s * 1000
            for p, epoch in taken:
                del unloaded[p]
                if p not in gone and self._clock.now_ms() - written >= renew_every_ms:
                    written = self._clock.now_ms()
                    gone |= await self._renew_while_loading({**unloaded, p: epoch}, written)
                if p in gone:
                    self.loading.discard(p)
                    continue
                try:
                    await self._on_acquired(LeaseToken(p, self.instance_id, epoch))
                except Exception:
                    # One partition that cannot be loaded (a record that does not read) must
                    # not keep the partitions after it from being loaded. Its lease is left
                    # to run out unrenewed, and it is taken and loaded again after that.
                    self._metrics.set_aside.labels(loop="leases").inc()
                    self._set_aside[p] = now + self._lease_ms
                    log.exception("transaction log partition %d could not be loaded; "
                                  "trying again when its lease runs out", p)
                    with contextlib.suppress(Exception):
                        await self._on_lost(p)  # drop whatever part of it was loaded
                    continue
                else:
                    self.owned[p] = epoch
                    self._valid_until[p] = written + self._lease_ms
                    log.info("took transaction log partition %d at coordinator epoch %d", p, epoch)
                finally:
                    self.loading.discard(p)

    async def _renew_while_loading(self, loading: dict[int, int], now: int) -> set[int]:
        """Renew, in the middle of a round, the leases this instance holds and those it
        took in this round and has yet to load; the partitions whose row moved on (the
        held ones among them dropped, as at the start of a round)."""
        renewing = {**self.owned, **loading}
        lost = await self._db.run(self._renew, renewing, now)
        for p, epoch in renewing.items():
            if p not in lost and self.owned.get(p) == epoch:
                self._valid_until[p] = now + self._lease_ms
        for p in lost:
            if p in self.owned:
                await self.drop(p, renewing[p])
        return set(lost)

    async def drop(self, log_partition: int, epoch: int | None = None) -> None:
        """Forget a partition whose lease has moved on (found by renewal or a failed write).

        ``epoch``: the coordinator epoch of the lease the failed write was made under. A
        request that took its token before this instance lost the partition and took it
        again writes under the old epoch, and is fenced; that says nothing of the lease
        held now, which is kept. Dropped, it was taken again at the next round under a new
        epoch, which failed the writes in flight under the one before, which dropped it
        again: a loop that kept the partition unloading and loading (its requests
        answered NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS, its markers abandoned)
        for as long as requests kept coming."""
        if epoch is not None and self.owned.get(log_partition) != epoch:
            return
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
        if self.last_plan is not None and self.last_plan.imbalanced:
            wait = min(wait, _REBALANCE_POLL_S)  # a hand-over is under way: pick it up soon
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
                # the soonest foreign expiry read before is no reason to try again at once:
                # with the database away it only made the next rounds fail in a tight loop
                self._foreign_expiry = None

    async def release_all(self) -> None:
        """Release every transaction-log lease this instance holds (a clean stop).

        Waits for a round in flight first: its database work may still be taking rows on
        a worker thread after its task was cancelled, rows this instance would then never
        know it owns. So the release goes by owner, not by what is known to be owned (an
        instance id names one process's life, so no other process's rows match)."""
        async with self._round_lock:
            self.owned.clear()
            self._valid_until.clear()

            def release(conn: Connection) -> int:
                return conn.execute(
                    leases.update()
                    .where(
                        leases.c.owner == self.instance_id,
                        leases.c.log_partition >= 0,
                        leases.c.log_partition < self._partitions,
                    )
                    .values(expires_at_ms=0)
                ).rowcount

            released = await self._db.run(release)
            log.info("released %d transaction log partitions", released)
