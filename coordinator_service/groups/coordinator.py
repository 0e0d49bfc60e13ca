"""The group coordinator: heartbeats, session expiry and the group's lease-fenced state.

Where a group lives. A group id hashes to a transaction-log partition exactly as a
transactional id does, and the instance holding that partition's lease is the group's
coordinator; any other instance answers NOT_COORDINATOR naming it. So the groups share
out over coordinator instances with the leases, fail over with them (within the lease
time), and need no second placement scheme. The state is in the coordinator's database,
written before every answer that changed it; the committed offsets stay where they are,
on the storage nodes (``__consumer_offsets``).

Each heartbeat runs under the group's lock: load the group if this instance has not yet
(or holds a newer lease than it was loaded under), apply the join, leave or heartbeat,
recompute the targets when the group epoch moved past the assignment epoch, reconcile the
member (``membership.reconcile``), write what changed, answer. A heartbeat with nothing to
tell is held up to ``max_wait_ms`` and answered at once when its member's assignment
moves, so a member learns of a rebalance without polling fast.

Sessions are kept in memory: a member that has not heartbeated for the session timeout,
or has not let go of revoked partitions within its rebalance timeout, is removed by
``expire_once`` — durably, before anyone else is given its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable

from coordinator_service.clock import Clock
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.controller.metadata import Metadata
from coordinator_service.db.engine import Database
from coordinator_service.groups import store
from coordinator_service.groups.assignor import MemberSubscription, assign
from coordinator_service.groups.membership import (
    NOTHING,
    EpochCheck,
    Group,
    Member,
    Partitions,
    check_epoch,
    expired,
    reconcile,
    release,
)
from coordinator_service.groups.subscriptions import SubscriptionResolver, check_subscription
from coordinator_service.groups.writer import GroupWriter, snapshot
from coordinator_service.transactions import state as st
from coordinator_service.transactions.store import LeaseToken
from eos_protocol.common import TopicPartition
from eos_protocol.errors import (
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    NotCoordinatorError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)
from eos_protocol.groups import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    GroupHeartbeatRequest,
    GroupHeartbeatResponse,
)

log = logging.getLogger("eos.coordinator.groups")


class GroupCoordinator:
    """Membership of the consumer groups whose lease this instance holds."""

    def __init__(
        self,
        *,
        db: Database,
        metadata: Metadata,
        clock: Clock,
        lease_clock: Clock,
        log_partitions: int,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        rebalance_timeout_ms: int,
        max_size: int,
    ) -> None:
        self._db = db
        self._clock = clock
        self._lease_clock = lease_clock
        self._log_partitions = log_partitions
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.max_size = max_size
        self.leases: LeaseManager | None = None
        self.resolver = SubscriptionResolver(metadata)
        self._writer = GroupWriter(db, lease_clock)
        self._groups: dict[str, tuple[LeaseToken, Group]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: the held heartbeat of each member, woken when its assignment may have moved
        self._moved: dict[tuple[str, str], asyncio.Event] = {}
        self.rebalances = 0

    def partition_of(self, group_id: str) -> int:
        return st.txn_log_partition(group_id, self._log_partitions)

    def locked(self, group_id: str) -> asyncio.Lock:
        """The lock every change of ``group_id`` is made under."""
        return self._lock(group_id)

    async def owned(self, group_id: str) -> tuple[LeaseToken, Group]:
        """The group as its coordinator holds it (NOT_COORDINATOR elsewhere); call it
        under ``locked``."""
        return await self._owned(group_id)

    async def delete(self, group_id: str, token: LeaseToken) -> None:
        """Delete the group's rows after every change queued before (under its lock)."""
        group = Group(group_id, self.partition_of(group_id))
        write = snapshot(token, group, set(), set())
        write.group_row = None
        await self._written(group_id, self._writer.submit(write))
        self.forget(group_id)

    async def stop(self) -> None:
        await self._writer.stop()

    def forget(self, group_id: str) -> None:
        """Drop the cached group (deleted, or to be read again from the database)."""
        self._groups.pop(group_id, None)
        self.resolver.forget(group_id)
        self._wake_all(group_id)

    def _lock(self, group_id: str) -> asyncio.Lock:
        lock = self._locks.get(group_id)
        if lock is None:
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    def _wake(self, group_id: str, member_ids: Iterable[str]) -> None:
        """Answer the held heartbeats of these members now: their assignment may move."""
        for member_id in member_ids:
            event = self._moved.pop((group_id, member_id), None)
            if event is not None:
                event.set()

    def _wake_all(self, group_id: str) -> None:
        self._wake(group_id, [m for g, m in list(self._moved) if g == group_id])

    def _wake_waiting(self, group: Group) -> None:
        """Partitions were let go of: wake the members still waiting for some."""
        self._wake(group.group_id, [m.member_id for m in group.members.values()
                                    if m.target - m.assigned])

    def _move_event(self, group_id: str, member_id: str) -> asyncio.Event:
        event = self._moved.get((group_id, member_id))
        if event is None:
            event = self._moved[(group_id, member_id)] = asyncio.Event()
        return event

    async def _owned(self, group_id: str) -> tuple[LeaseToken, Group]:
        assert self.leases is not None
        token = await self.leases.require(self.partition_of(group_id))
        cached = self._groups.get(group_id)
        if cached is not None and cached[0] == token:
            return cached
        group = await self._db.run(store.load_group, group_id)
        if group is None:
            group = Group(group_id, self.partition_of(group_id))
        deadline = self._clock.now_ms() + self.session_timeout_ms
        for member in group.members.values():  # a whole session from the load
            member.session_deadline_ms = deadline
        self._groups[group_id] = (token, group)
        return token, group

    def _save(
        self, token: LeaseToken, group: Group, members: set[str], removed: set[str]
    ) -> asyncio.Future[bool]:
        """Queue the group's changed rows (under its lock); await ``_written`` on the
        result after the lock is released."""
        return self._writer.submit(snapshot(token, group, members, removed))

    async def _written(self, group_id: str, pending: asyncio.Future[bool] | None) -> None:
        """Wait until a queued change is durable; NOT_COORDINATOR when the lease moved on
        (the group is read again from the database next time)."""
        if pending is None:
            return
        if not await pending:
            self._groups.pop(group_id, None)  # the database is the truth: reload
            raise NotCoordinatorError(
                f"the lease of group {group_id!r} moved to another coordinator; look it up "
                "again"
            )

    # --- heartbeat -----------------------------------------------------------------------

    async def heartbeat(
        self, group_id: str, req: GroupHeartbeatRequest, client_host: str | None = None
    ) -> GroupHeartbeatResponse:
        await check_subscription(self.resolver, req)
        owned = None if req.owned_partitions is None else frozenset(
            (tp.topic, tp.partition) for tp in req.owned_partitions
        )
        wait_until = self._clock.now_ms() + req.max_wait_ms
        while True:
            async with self._lock(group_id):
                answer, idle, pending = await self._beat(group_id, req, owned, client_host)
                moved = self._move_event(group_id, answer.member_id)
            await self._written(group_id, pending)
            remaining = wait_until - self._clock.now_ms()
            if not idle or remaining <= 0:
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), remaining / 1000)
            if not moved.is_set():
                return answer
            req = req.model_copy(update={
                "member_id": answer.member_id, "member_epoch": answer.member_epoch,
                "subscribed_topic_names": None, "subscribed_topic_regex": None,
            })

    async def _beat(
        self,
        group_id: str,
        req: GroupHeartbeatRequest,
        owned: Partitions | None,
        client_host: str | None,
    ) -> tuple[GroupHeartbeatResponse, bool, asyncio.Future[bool] | None]:
        token, group = await self._owned(group_id)
        now = self._clock.now_ms()
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            answer, left = self._leave(token, group, req)
            return answer, False, left
        changed: set[str] = set()
        removed: set[str] = set()
        epoch_before = group.group_epoch
        if req.member_epoch == JOIN_EPOCH:
            member = self._join(group, req, client_host, changed, removed)
        else:
            member = self._known(group, req, owned)
        member.session_deadline_ms = now + self.session_timeout_ms
        if self._update_member(group, member, req, client_host):
            changed.add(member.member_id)
        if self.resolver.refresh_group(group):
            group.group_epoch += 1
        if group.group_epoch > epoch_before + 1:
            group.group_epoch = epoch_before + 1  # one heartbeat, one new group epoch
        moved = self._assign(group) if group.group_epoch > group.assignment_epoch else set()
        changed |= moved
        revoking = member.pending_revocation
        if reconcile(group, member, owned, now):
            changed.add(member.member_id)
        pending: asyncio.Future[bool] | None = None
        if changed or removed or group.group_epoch != epoch_before:
            pending = self._save(token, group, changed, removed)
        self._wake(group_id, moved - {member.member_id})
        if (revoking and not member.pending_revocation) or removed:
            self._wake_waiting(group)  # what it let go of: others may take it now
        answer = self._answer(member)
        idle = (
            not changed and owned is not None and owned == member.assigned
            and not member.pending_revocation
        )
        return answer, idle, pending

    def _answer(self, member: Member) -> GroupHeartbeatResponse:
        return GroupHeartbeatResponse(
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            session_timeout_ms=self.session_timeout_ms,
            assignment=[TopicPartition(topic=t, partition=p) for t, p in sorted(member.assigned)],
        )

    def _known(self, group: Group, req: GroupHeartbeatRequest, owned: Partitions | None
               ) -> Member:
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None or member.left_static:
            raise UnknownMemberIdError(
                f"group {group.group_id!r} has no member {req.member_id!r} (it left or its "
                "session timed out); join again with member_epoch 0"
            )
        if check_epoch(member, req.member_epoch, owned) is EpochCheck.FENCED:
            raise FencedMemberEpochError(
                f"member {member.member_id!r} of group {group.group_id!r} sent epoch "
                f"{req.member_epoch}, its epoch is {member.member_epoch}: its partitions "
                "may be another member's now; join again with member_epoch 0"
            )
        return member

    def _join(
        self,
        group: Group,
        req: GroupHeartbeatRequest,
        client_host: str | None,
        changed: set[str],
        removed: set[str],
    ) -> Member:
        previous: Member | None = None
        if req.instance_id is not None:
            previous = group.by_instance(req.instance_id)
            if previous is not None and not previous.left_static and (
                previous.member_id != req.member_id
            ):
                raise UnreleasedInstanceIdError(
                    f"instance id {req.instance_id!r} is in use by member "
                    f"{previous.member_id!r} of group {group.group_id!r}"
                )
        if previous is None and req.member_id is not None and req.member_id in group.members:
            previous = group.members[req.member_id]  # a fenced member joining again
            if previous.instance_id is None:
                release(group, previous.member_id)
                removed.add(previous.member_id)
                previous = None
        if previous is None and sum(
            1 for m in group.members.values() if not m.left_static
        ) >= self.max_size:
            raise GroupMaxSizeReachedError(
                f"group {group.group_id!r} has {self.max_size} members, the most allowed "
                "(group_max_size)"
            )
        member_id = req.member_id or uuid.uuid4().hex
        member = Member(
            member_id=member_id, member_epoch=0, previous_member_epoch=0,
            rebalance_timeout_ms=req.rebalance_timeout_ms or self.rebalance_timeout_ms,
            instance_id=req.instance_id, rack_id=req.rack_id, client_host=client_host,
        )
        if previous is not None and previous.instance_id is not None:
            # static membership: the new copy takes over its predecessor's partitions,
            # epoch and target, and nobody else moves
            group.members.pop(previous.member_id)
            removed.add(previous.member_id)
            member.member_epoch, member.previous_member_epoch = (
                (previous.previous_member_epoch, previous.previous_member_epoch)
                if previous.left_static
                else (previous.member_epoch, previous.previous_member_epoch)
            )
            member.assigned = previous.assigned
            member.pending_revocation = previous.pending_revocation
            member.target = previous.target
            member.subscribed_topic_names = previous.subscribed_topic_names
            member.subscribed_topic_regex = previous.subscribed_topic_regex
        else:
            group.group_epoch += 1
        group.members[member_id] = member
        changed.add(member_id)
        return member

    def _update_member(
        self, group: Group, member: Member, req: GroupHeartbeatRequest, client_host: str | None
    ) -> bool:
        changed = False
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            if names != member.subscribed_topic_names or member.subscribed_topic_regex:
                member.subscribed_topic_names, member.subscribed_topic_regex = names, None
                group.group_epoch += 1
                changed = True
        if req.subscribed_topic_regex is not None and (
            req.subscribed_topic_regex != member.subscribed_topic_regex
        ):
            member.subscribed_topic_regex, member.subscribed_topic_names = (
                req.subscribed_topic_regex, ()
            )
            group.group_epoch += 1
            changed = True
        if req.rebalance_timeout_ms is not None and (
            req.rebalance_timeout_ms != member.rebalance_timeout_ms
        ):
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
            changed = True
        if req.rack_id is not None and req.rack_id != member.rack_id:
            member.rack_id = req.rack_id
            changed = True
        if client_host is not None and member.client_host is None:
            member.client_host = client_host
            changed = True
        return changed

    def _assign(self, group: Group) -> set[str]:
        """New targets for the group epoch; the members whose target changed."""
        subs = [
            MemberSubscription(m.member_id, self.resolver.topics_of(m), m.rack_id)
            for m in group.members.values()
        ]
        targets = assign(
            subs, group.subscribed_metadata, {m.member_id: m.target for m in group.members.values()}
        )
        group.assignment_epoch = group.group_epoch
        self.rebalances += 1
        changed = set()
        for member_id, target in targets.items():
            member = group.members[member_id]
            if member.target != target:
                member.target = target
                changed.add(member_id)
        return changed

    def _leave(
        self, token: LeaseToken, group: Group, req: GroupHeartbeatRequest
    ) -> tuple[GroupHeartbeatResponse, asyncio.Future[bool]]:
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None:
            raise UnknownMemberIdError(
                f"group {group.group_id!r} has no member {req.member_id!r} to leave"
            )
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH  # its partitions wait for it
            pending = self._save(token, group, {member.member_id}, set())
        else:
            release(group, member.member_id)
            pending = self._removed(token, group, {member.member_id})
        self._wake(group.group_id, [member.member_id])  # its own held heartbeat ends now
        return GroupHeartbeatResponse(
            member_id=member.member_id, member_epoch=req.member_epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            session_timeout_ms=self.session_timeout_ms, assignment=[],
        ), pending

    # --- sessions ------------------------------------------------------------------------

    async def expire_once(self) -> int:
        """Remove every member past its session (or its rebalance timeout while it still
        holds revoked partitions) from the groups this instance owns; how many."""
        assert self.leases is not None
        removed_total = 0
        for group_id, (token, _) in list(self._groups.items()):
            if self.leases.token(token.log_partition) != token:
                self._groups.pop(group_id, None)  # the lease moved on: another owns it
                continue
            async with self._lock(group_id):
                cached = self._groups.get(group_id)
                if cached is None or cached[0] != token:
                    continue
                group = cached[1]
                gone = expired(group, self._clock.now_ms())
                if not gone:
                    continue
                for member_id in gone:
                    log.info("group %s: member %s removed (session or rebalance timeout)",
                             group_id, member_id)
                    release(group, member_id)
                pending = self._removed(token, group, set(gone))
            try:
                await self._written(group_id, pending)
            except NotCoordinatorError:
                continue
            removed_total += len(gone)
        return removed_total

    def _removed(self, token: LeaseToken, group: Group, gone: set[str]
                 ) -> asyncio.Future[bool]:
        """After members were removed: new targets at once (the others need not wait
        for a heartbeat to learn of them), written with the removal, and the members
        whose assignment moves woken."""
        moved = self._assign(group) if group.group_epoch > group.assignment_epoch else set()
        pending = self._save(token, group, moved, gone)
        self._wake(group.group_id, moved)
        self._wake_waiting(group)
        return pending

    async def load_owned(self) -> None:
        """Load the groups of every lease held, so members of a group none of whose
        members heartbeat here any more still time out."""
        assert self.leases is not None
        owned = sorted(self.leases.owned)
        for group_id in await self._db.run(store.group_ids_in, owned):
            if group_id not in self._groups:
                with contextlib.suppress(Exception):
                    async with self._lock(group_id):
                        await self._owned(group_id)

    async def run_forever(self) -> None:
        interval_s = max(0.05, min(1.0, self.session_timeout_ms / 10_000))
        rounds = 0
        while True:
            await asyncio.sleep(interval_s)
            try:
                if rounds % 20 == 0:
                    await self.load_owned()
                await self.expire_once()
            except Exception:  # the database may be away for a while
                log.exception("group session expiry failed")
            rounds += 1

    # --- reads ---------------------------------------------------------------------------

    def cached(self, group_id: str) -> Group | None:
        found = self._groups.get(group_id)
        return None if found is None else found[1]

    def member_count(self) -> int:
        return sum(len(g.members) for _, g in self._groups.values())

    def coordinated(self) -> list[Group]:
        """The groups loaded here under a lease, for the metrics (read-only: mutate them
        only under ``locked``)."""
        return [g for _, g in self._groups.values()]


__all__ = ["NOTHING", "GroupCoordinator"]
