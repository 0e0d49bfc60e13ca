"""The controller: the one coordinator instance that runs elections (design §7).

Any instance may be the controller; the one holding the controller lease (the ``leases``
row at ``CONTROLLER_LEASE``, taken and renewed like a transaction-log lease, its
``coordinator_epoch`` the controller epoch) is. Every ``controller_interval_ms`` it reads
the nodes' heartbeats; when the set of live nodes changed (or at least once a session
timeout, and when leaders are due to move back) it reads every partition's state too,
asks ``election.decide`` what to change and writes each change with a compare-and-set on
the partition epoch, fenced by its lease: a controller that lost its lease, or raced
another one or a leader's AlterPartition, writes nothing and reads again at the next
round. Reading every partition five times a second cost an idle cluster a steady share of
a core, and a cluster of ten thousand partitions far more; a node's death is still seen
within one interval of its session timeout.

Nodes never heard from count as alive during the first session timeout after this
instance became controller, so a fresh cluster (or a coordinator upgraded before its
nodes send heartbeats) does not elect before the nodes have had a chance to report.

One partition that cannot be handled — a row that does not read, a write the database
refuses — is set aside (logged once, counted in
``eos_coordinator_background_entries_set_aside_total{loop="controller"}``) and the round
goes on with the others.

Each new state is also pushed to the partition's replicas (``state_push.py``), so they
act on it before their next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.cluster.leases import release_lease
from coordinator_service.controller.election import Change, decide, prefer
from coordinator_service.controller.partition_state import (
    ControllerFence,
    Liveness,
    PartitionKey,
    StatesReader,
    StoredPartition,
    compare_and_set,
    latest_beats,
    read_heartbeats,
)
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import CONTROLLER_LEASE, leases
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.replication import NO_LEADER

#: The most changes one round writes in one transaction.
CHANGES_PER_TRANSACTION = 500

#: Which nodes a round judged alive, and whether nodes never heard from counted as alive.
AliveSet = tuple[frozenset[int], bool]

log = logging.getLogger("eos.coordinator.controller")


def ensure_controller_row(conn: Connection) -> None:
    """The migration makes the row; this only repairs a database where it was deleted."""
    serialize_first_start(conn)
    found = conn.execute(
        sa.select(leases.c.log_partition).where(leases.c.log_partition == CONTROLLER_LEASE)
    ).first()
    if found is None:
        conn.execute(leases.insert().values(log_partition=CONTROLLER_LEASE))


class Controller:
    """Holds (or waits for) the controller lease and runs the elections while it does."""

    def __init__(
        self,
        db: Database,
        *,
        instance_id: str,
        url: str,
        node_id: int,
        clock: Clock,
        lease_ms: int,
        session_timeout_ms: int,
        interval_ms: int,
        rebalance_interval_ms: int = 30_000,
        metrics: CoordinatorMetrics | None = None,
        on_change: Callable[[], None] | None = None,
        on_state: Callable[[StoredPartition], None] | None = None,
        heard: Mapping[int, int] | None = None,
    ) -> None:
        self._db = db
        # beats this instance received and may not have written yet (``Replication.heard``)
        self.heard: Mapping[int, int] = heard if heard is not None else {}
        self.instance_id = instance_id
        self._url = url
        self._node_id = node_id
        self._clock = clock
        self._lease_ms = lease_ms
        self._renew_every_ms = max(lease_ms // 3, 1)
        self.session_timeout_ms = session_timeout_ms
        self._interval_s = interval_ms / 1000
        self._rebalance_every_ms = rebalance_interval_ms
        self._rebalanced_ms: int | None = None  # the last preferred-leader pass
        self.metrics = metrics or CoordinatorMetrics()
        self._on_change = on_change
        self._on_state = on_state or (lambda _state: None)
        self.epoch: int | None = None  # the controller epoch while this instance holds it
        self.since_ms = 0  # when this instance became controller
        self._renewed_ms = 0
        self._reported: set[PartitionKey] = set()
        self._full_round: tuple[int, AliveSet] | None = None  # when, and what it saw alive
        self._states = StatesReader()  # a full round builds only changed states anew

    # --- the lease -----------------------------------------------------------------------

    def _hold(self, conn: Connection, now: int) -> int | None:
        """Renew our lease or take a free one; the controller epoch we hold, or None."""
        if self.epoch is not None:
            renewed = conn.execute(
                leases.update()
                .where(
                    leases.c.log_partition == CONTROLLER_LEASE,
                    leases.c.owner == self.instance_id,
                    leases.c.coordinator_epoch == self.epoch,
                )
                .values(expires_at_ms=now + self._lease_ms)
            )
            return self.epoch if renewed.rowcount == 1 else None
        row = conn.execute(
            sa.select(leases.c.coordinator_epoch, leases.c.owner, leases.c.expires_at_ms)
            .where(leases.c.log_partition == CONTROLLER_LEASE)
        ).first()
        if row is None or (row.owner is not None and row.expires_at_ms > now):
            return None
        taken = conn.execute(
            leases.update()
            .where(
                leases.c.log_partition == CONTROLLER_LEASE,
                leases.c.coordinator_epoch == row.coordinator_epoch,
            )
            .values(
                owner=self.instance_id, owner_url=self._url, owner_node_id=self._node_id,
                coordinator_epoch=row.coordinator_epoch + 1, expires_at_ms=now + self._lease_ms,
            )
        )
        return int(row.coordinator_epoch) + 1 if taken.rowcount == 1 else None

    async def hold_lease(self) -> bool:
        """Whether this instance is the controller now (renewing every third of the lease
        time, taking the lease once it is free)."""
        now = self._clock.now_ms()
        if self.epoch is not None and now - self._renewed_ms < self._renew_every_ms:
            return True
        before = self.epoch
        self.epoch = await self._db.run(self._hold, now)
        if self.epoch is None:
            if before is not None:
                log.warning("no longer the controller (epoch %d)", before)
            return False
        self._renewed_ms = now
        if before != self.epoch:
            self.since_ms = now
            log.info("controller at epoch %d", self.epoch)
        return True

    async def release(self) -> None:
        """On a clean shutdown: let another instance take over at its next round."""
        epoch, self.epoch = self.epoch, None
        if epoch is None:
            return

        await self._db.run(release_lease, CONTROLLER_LEASE, self.instance_id, epoch)

    # --- a round -------------------------------------------------------------------------

    def liveness(self, heartbeats: dict[int, int], now: int) -> Liveness:
        return Liveness(
            heartbeats, now, self.session_timeout_ms,
            unknown_alive=now - self.since_ms < self.session_timeout_ms,
        )

    async def run_once(self) -> int:
        """One round if this instance is the controller; returns the changes written."""
        if not await self.hold_lease():
            self._full_round = None
            return 0
        # the time before the read: a read that waits behind other work (a topic's
        # thousand partitions being recorded) must not make the beats it returns look
        # older than they are, or a node beating on time is taken for dead
        now = self._clock.now_ms()
        heartbeats = latest_beats(await self._db.run(read_heartbeats), self.heard)
        liveness = self.liveness(heartbeats, now)
        alive = (frozenset(n for n in heartbeats if liveness.alive(n)), liveness.unknown_alive)
        rebalance = self._rebalance_due(now)
        if not rebalance and not self._full_round_due(now, alive):
            return 0
        self._full_round = (now, alive)
        stored, bad, _changed = await self._db.run(self._states)
        for key, reason in bad.items():
            self._set_aside(key, f"unreadable row: {reason}")
        assert self.epoch is not None
        fence = ControllerFence(self.instance_id, self.epoch, now)
        states: dict[PartitionKey, StoredPartition] = {}
        changes: list[tuple[StoredPartition, Change]] = []
        for state in stored:
            states[state.key] = state
            try:
                change = decide(state, liveness.alive)
                if change is None and rebalance:
                    change = prefer(state, liveness.alive)
                if change is not None:
                    changes.append((state, change))
                self._reported.discard(state.key)
            except Exception as exc:  # one partition must not stop the others
                self._full_round = None
                self._set_aside(state.key, f"{type(exc).__name__}: {exc}")
        written = 0
        for start in range(0, len(changes), CHANGES_PER_TRANSACTION):
            batch = changes[start : start + CHANGES_PER_TRANSACTION]
            for state, change, after in await self._write(batch, fence):
                if after is None:  # the row moved first: read everything again next round
                    self._full_round = None
                    continue
                self._changed(state, change, after)
                states[state.key] = after
                written += 1
        self._gauges(list(states.values()), liveness)
        if written and self._on_change is not None:
            self._on_change()
        return written

    def _full_round_due(self, now: int, alive: AliveSet) -> bool:
        """Whether this round reads every partition: the first as controller, when a node
        died or came back, and once a session timeout (a partition changed by someone
        else, a leader's AlterPartition or a new topic, is looked at within that)."""
        if self._full_round is None:
            return True
        at, seen = self._full_round
        return seen != alive or now - at >= self.session_timeout_ms

    def _rebalance_due(self, now: int) -> bool:
        """Whether this round also moves leaders back to their preferred replicas: every
        ``rebalance_interval_ms`` (0: never), not before one interval as controller, so
        that a node just back has caught up first."""
        if self._rebalance_every_ms <= 0:
            return False
        if self._rebalanced_ms is None:
            self._rebalanced_ms = now
        if now - self._rebalanced_ms < self._rebalance_every_ms:
            return False
        self._rebalanced_ms = now
        return True

    async def _write(
        self, changes: list[tuple[StoredPartition, Change]], fence: ControllerFence
    ) -> list[tuple[StoredPartition, Change, StoredPartition | None]]:
        """Write changes, each a compare-and-set fenced by the lease, in one transaction:
        a node's death changes every partition it held, and a transaction (a commit, an
        fsync) for each of a thousand kept the database from the heartbeats meanwhile.
        Should the batch fail, each is written on its own, so that one partition whose
        write fails is set aside and the others go on."""

        def write_all(conn: Connection) -> list[StoredPartition | None]:
            return [compare_and_set(conn, state, c.leader, c.isr, fence) for state, c in changes]

        try:
            afters = await self._db.run(write_all)
        except Exception as exc:
            if len(changes) == 1:
                self._set_aside(changes[0][0].key, f"{type(exc).__name__}: {exc}")
                afters = [None]
            else:
                afters = [(await self._write([one], fence))[0][2] for one in changes]
        return [(s, c, a) for (s, c), a in zip(changes, afters, strict=True)]

    def _changed(self, state: StoredPartition, change: Change, after: StoredPartition) -> None:
        """A change written: push it, count it, say it."""
        self._on_state(after)
        m = self.metrics
        if change.removed:
            m.isr_shrinks.inc()
        if change.elected(state):
            kind = "unclean" if change.unclean else "clean"
            if state.leader != NO_LEADER and not change.removed and set(change.isr) == set(
                state.isr
            ):
                kind = "preferred"
            m.leader_elections.labels(kind=kind).inc()
        log.warning(
            "partition %s/%d: leader %d -> %d (leader epoch %d), ISR %s -> %s%s",
            state.topic, state.partition, state.leader, after.leader, after.leader_epoch,
            list(state.isr), list(after.isr), " (unclean election)" if change.unclean else "",
            extra={"topic": state.topic, "partition": state.partition,
                   "leader": after.leader, "leader_epoch": after.leader_epoch},
        )

    def _gauges(self, states: list[StoredPartition], liveness: Liveness) -> None:
        def offline(s: StoredPartition) -> bool:
            if s.leader == NO_LEADER:
                return True
            # a node that has never sent a heartbeat (an older node) is not judged
            return liveness.heard_from(s.leader) and not liveness.alive(s.leader)

        self.metrics.offline_partitions.set(sum(1 for s in states if offline(s)))
        self.metrics.under_replicated_partitions.set(sum(1 for s in states if s.under_replicated))

    def _set_aside(self, key: PartitionKey, reason: str) -> None:
        """Report a partition once (not at every round) until it is handled again."""
        if key in self._reported:
            return
        self._reported.add(key)
        self.metrics.set_aside.labels(loop="controller").inc()
        log.error("controller: partition %s/%d set aside (%s); the others go on",
                  key[0], key[1], reason,
                  extra={"topic": key[0], "partition": key[1], "reason": reason})

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the database may be away for a while: try again next round
                log.exception("controller round failed")
            await asyncio.sleep(self._interval_s)
