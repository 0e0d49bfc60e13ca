"""What storage nodes ask the coordinator about replication (design §7): heartbeats and
AlterPartition. Any instance answers both: the state is in the database.

A heartbeat records that the node is alive (``node_heartbeats``, the time by this
instance's lease clock, which the controller compares with its own) and answers the node's
view of the cluster: every storage node and the state of every partition the node is a
replica of. Nodes learn their roles from these answers (pull), so an answer lost on the way
is repaired by the next beat. A node of thousands of partitions beating twice a second
would spend its cores reading the same states over and over: each answer carries a digest
of them, the node sends back the digest of the last states it applied in full, and while
they are still the node's states the answer leaves them out (``unchanged``). Digests are
the same on every instance (the same states, serialised the same way), so a node that
moves to another coordinator is not sent everything again.

AlterPartition is a leader proposing a new ISR (Kafka's KIP-497). It is accepted only at
the epochs stored now — the leader's own, ``leader_epoch`` and ``partition_epoch`` — and
otherwise answered ``FENCED_LEADER_EPOCH`` with the stored state in the error's details,
so the node catches up without another call. The new ISR must hold the leader and only
replicas, and a replica joins only while it is alive. The write is a compare-and-set on the
partition epoch, like the controller's, so it cannot undo an election made meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable

import orjson
from sqlalchemy import Connection

from coordinator_service.clock import Clock
from coordinator_service.controller.election import decide
from coordinator_service.controller.partition_state import (
    Liveness,
    StatesReader,
    StoredPartition,
    compare_and_set,
    latest_beats,
    read_heartbeats,
    read_state,
    read_states,
    write_heartbeat,
    write_heartbeats,
)
from coordinator_service.db.engine import Database
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.coordinator import NodeInfo
from eos_protocol.errors import (
    EosError,
    FencedLeaderEpochError,
    InternalError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.replication import AlterIsrRequest, HeartbeatAnswer, IsrChange, PartitionState

log = logging.getLogger("eos.coordinator.replication")

#: How old a heartbeat answer's partition states may be.
STATES_TTL_S = 1.0
#: How long a beat waits for states read afresh before it is answered with older ones, or
#: none (the node keeps its roles): a late beat answer delays the node's next beat.
STATES_WAIT_S = 0.5


def fenced(stored: StoredPartition, message: str) -> EosError:
    """``FENCED_LEADER_EPOCH`` carrying the stored state, so the node can catch up."""
    return FencedLeaderEpochError(message, details=stored.wire().model_dump())


def check_isr(stored: StoredPartition, isr: list[int], liveness: Liveness) -> tuple[int, ...]:
    """The proposed ISR in ``replicas`` order, or ``INVALID_REQUEST`` saying what is wrong."""
    if len(set(isr)) != len(isr):
        raise InvalidRequestError(f"the ISR {isr} names a replica twice")
    if stored.leader not in isr:
        raise InvalidRequestError(f"the ISR {isr} must include the leader {stored.leader}")
    strangers = sorted(set(isr) - set(stored.replicas))
    if strangers:
        raise InvalidRequestError(
            f"nodes {strangers} are not replicas of {stored.topic}/{stored.partition} "
            f"(replicas {list(stored.replicas)})"
        )
    joining = sorted(r for r in set(isr) - set(stored.isr) if not liveness.alive(r))
    if joining:
        raise InvalidRequestError(
            f"replicas {joining} cannot join the ISR: they are not alive "
            "(no heartbeat within the session timeout)"
        )
    return tuple(r for r in stored.replicas if r in isr)


def _retrieve(task: asyncio.Task[object]) -> None:
    """A background read that failed is seen by the beats that wait for it, if any."""
    if not task.cancelled():
        task.exception()


class Replication:
    """Heartbeats and AlterPartition, answered from the database."""

    def __init__(
        self,
        db: Database,
        *,
        nodes: dict[int, str],
        clock: Clock,
        session_timeout_ms: int,
        metrics: CoordinatorMetrics | None = None,
        on_state: Callable[[StoredPartition], None] | None = None,
    ) -> None:
        self._db = db
        self._on_state = on_state or (lambda _state: None)
        self._nodes = dict(sorted(nodes.items()))
        self._clock = clock
        self._session_timeout_ms = session_timeout_ms
        self.metrics = metrics or CoordinatorMetrics()
        # when the states were read, them, and whether no change was made here since
        self._cache: tuple[float, list[StoredPartition], bool] | None = None
        self._reader = StatesReader()  # builds the states again only when a row changed
        # each node's states and their digest, for the states of ``_cache``
        self._views: dict[int, tuple[str, list[StoredPartition]]] = {}
        self._reported: set[tuple[str, int]] = set()
        # When this instance last heard each node, by its lease clock, known here before
        # the database has it: a beat whose write waits behind other transactions (SQLite
        # takes one writer at a time) still counts for this instance's controller.
        self.heard: dict[int, int] = {}
        # Beats not yet written, and the incarnation last written for each node: a node
        # known here beating again is answered at once and its beat written behind the
        # answer, with the others', in one transaction (``_write_beats``); only a new
        # incarnation (a restart, or a node this instance has not seen) waits for its write.
        self._unwritten: dict[int, tuple[str, int, str | None]] = {}
        self._written: dict[int, str | None] = {}  # the incarnation written last
        self._writing_since: float | None = None  # when the write under way began
        self._writer: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[list[StoredPartition]] | None = None

    async def heartbeat(
        self,
        node_id: int,
        url: str | None,
        incarnation: str | None = None,
        *,
        known_states: str | None = None,
    ) -> HeartbeatAnswer:
        """Record the beat (without a URL: the one this coordinator is configured with)
        and answer the node's view of the cluster, its states left out when they are
        still those of ``known_states``. A node that restarted leaves every ISR first
        (``restarted``)."""
        url = url or self._nodes.get(node_id, "")
        now = self._clock.now_ms()
        self.heard[node_id] = max(now, self.heard.get(node_id, now))
        if self._answer_first(node_id, incarnation):
            self._unwritten[node_id] = (url, now, incarnation)
            if self._writer is None or self._writer.done():
                self._writer = asyncio.create_task(self._write_beats(), name="heartbeat writes")
        else:
            if await self._db.run(write_heartbeat, node_id, url, now, incarnation):
                await self.restarted(node_id)
            self._written[node_id] = incarnation
        view = await self._view(node_id)
        nodes = [NodeInfo(node_id=n, url=u) for n, u in self._nodes.items()]
        if view is None:  # no states in time: the node keeps its roles until next beat
            return HeartbeatAnswer(nodes=nodes, partitions=[])
        digest, mine = view
        if known_states == digest:
            return HeartbeatAnswer(nodes=nodes, partitions=[], states_digest=digest,
                                   unchanged=True)  # fmt: skip
        return HeartbeatAnswer(
            nodes=nodes, partitions=[s.wire() for s in mine], states_digest=digest
        )

    def _answer_first(self, node_id: int, incarnation: str | None) -> bool:
        """Whether this beat may be answered before it is written: the node's incarnation
        is the one this instance wrote last, that write did not fail, and no write has
        been under way for a session timeout. Otherwise the beat waits for its write, and
        a database that cannot take it fails the beat (``COORDINATOR_NOT_AVAILABLE``), so
        that a node cut off from the controller's database fences itself as before; a
        write merely queued behind other transactions (SQLite takes one at a time, and a
        topic of a thousand partitions is recorded in seconds) does not hold beats back."""
        written = self._written.get(node_id)
        stuck = (
            self._writing_since is not None
            and time.monotonic() - self._writing_since > self._session_timeout_ms / 1000
        )
        return incarnation is not None and written == incarnation and not stuck

    async def _write_beats(self) -> None:
        """Write the beats answered first, all those waiting in one transaction, until
        none waits. A failed write is logged: the next beats of those nodes wait for
        their own writes (``_answer_first``) and fail while the database is away."""
        while self._unwritten:
            beats, self._unwritten = self._unwritten, {}
            self._writing_since = time.monotonic()
            try:
                await self._db.run(write_heartbeats, beats)
            except Exception as exc:
                log.warning("heartbeats of nodes %s not written: %s", sorted(beats), exc)
                for node_id in beats:
                    self._written.pop(node_id, None)
                continue
            finally:
                self._writing_since = None
            for node_id, (_url, _now, incarnation) in beats.items():
                self._written[node_id] = incarnation

    async def close(self) -> None:
        """Write what waits, then stop the background work."""
        writer, refresh = self._writer, self._refresh
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(writer), timeout=5)
            writer.cancel()
        if refresh is not None:
            refresh.cancel()
            with contextlib.suppress(BaseException):
                await refresh

    async def _view(self, node_id: int) -> tuple[str, list[StoredPartition]] | None:
        """The states of the partitions ``node_id`` is a replica of, and their digest;
        None when the states could not be read in time."""
        states = await self._states()
        if states is None:
            return None
        view = self._views.get(node_id)
        if view is None:
            mine = [s for s in states if node_id in s.replicas]
            digest = hashlib.blake2b(orjson.dumps(mine), digest_size=16).hexdigest()
            view = self._views[node_id] = (digest, mine)
        return view

    def forget_states(self) -> None:
        """A state changed here: heartbeat answers from the next read on carry it."""
        if self._cache is not None:
            self._cache = (self._cache[0], self._cache[1], False)

    async def _states(self) -> list[StoredPartition] | None:
        """Every partition's state, read at most once per ``STATES_TTL_S`` for all the
        nodes' heartbeats together (each node beats a few times a second; the answer may
        be that old, the controller's push carries changes at once). A beat waits for a
        read up to ``STATES_WAIT_S``: a read that waits behind other transactions (SQLite
        takes one at a time) must not hold beats back until the controller takes their
        nodes for dead. Then it is answered from the states read before, if they are
        under half a session timeout old, else without states (None); a database that
        is away fails the beat."""
        cached = self._cache
        age = time.monotonic() - cached[0] if cached is not None else float("inf")
        if cached is not None and cached[2] and age < STATES_TTL_S:
            return cached[1]
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._read_states(), name="partition states")
            self._refresh.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(self._refresh), STATES_WAIT_S)
        except TimeoutError:
            if cached is not None and age < self._session_timeout_ms / 2000:
                return cached[1]
            return None

    async def _read_states(self) -> list[StoredPartition]:
        started = time.monotonic()
        states, bad, changed = await self._db.run(self._reader)
        if not changed:  # the views and digests of the last read stand
            self._cache = (started, states, True)
            return states
        self._views = {}
        for key, reason in bad.items():
            if key not in self._reported:
                self._reported.add(key)
                log.error("partition %s/%d left out of heartbeat answers: %s", key[0], key[1],
                          reason, extra={"topic": key[0], "partition": key[1]})  # fmt: skip
        self._cache = (started, states, True)
        return states

    async def restarted(self, node_id: int) -> None:
        """A node came back as a new process (Kafka: a broker that re-registers with a new
        epoch). What it had may be gone, and its followers' views are: for every replicated
        partition, it is treated as dead once (``election.decide``), so it leaves the ISR
        and, where it led, an in-sync replica takes over. If it was the last one in sync, the
        partition waits without a leader; the controller's next round elects it again if it
        is still the only one (its disk intact is the best there is). Each change is a
        compare-and-set: a concurrent election wins and this one is skipped."""
        now = self._clock.now_ms()

        def leave_every_isr(conn: Connection) -> list[StoredPartition]:
            """One transaction for all the partitions (a node holds many)."""
            liveness = Liveness(read_heartbeats(conn), now, self._session_timeout_ms)
            states, _bad = read_states(conn)
            changed = []
            for state in states:
                if not state.replicated or node_id not in state.isr:
                    continue
                change = decide(state, lambda r: r != node_id and liveness.alive(r))
                if change is not None:
                    after = compare_and_set(conn, state, change.leader, change.isr)
                    if after is not None:
                        changed.append(after)
            return changed

        changed = await self._db.run(leave_every_isr)
        self.forget_states()
        for after in changed:
            self._on_state(after)
            self.metrics.isr_shrinks.inc()
        if changed:
            log.warning("node %d restarted: it left the ISR of %d partitions, new leaders "
                        "where it led", node_id, len(changed), extra={"node_id": node_id})

    async def alter_isr(self, topic: str, partition: int, req: AlterIsrRequest) -> PartitionState:
        # built as is: the path's topic is checked by the route's own rules, and a name
        # the batch model would refuse is answered UNKNOWN_TOPIC_OR_PARTITION below
        change = IsrChange.model_construct(
            topic=topic, partition=partition, leader_epoch=req.leader_epoch,
            partition_epoch=req.partition_epoch, isr=req.isr,
        )  # fmt: skip
        (outcome,) = await self.alter_isr_many(req.leader, [change])
        if isinstance(outcome, EosError):
            raise outcome
        return outcome

    async def alter_isr_many(
        self, leader: int, changes: list[IsrChange]
    ) -> list[PartitionState | EosError]:
        """Each proposal decided on its own, all read and written in one transaction (a
        node back from a restart rejoins the ISR of every partition it holds: a
        transaction each kept the database from everything else meanwhile)."""
        now = self._clock.now_ms()  # before the read, as the controller does
        heard = dict(self.heard)

        def decide_all(
            conn: Connection,
        ) -> list[tuple[StoredPartition | None, StoredPartition | EosError]]:
            beats = latest_beats(read_heartbeats(conn), heard)
            liveness = Liveness(beats, now, self._session_timeout_ms)
            return [self._alter_one(conn, leader, change, liveness) for change in changes]

        outcomes: list[PartitionState | EosError] = []
        changed = False
        for before, outcome in await self._db.run(decide_all):
            if isinstance(outcome, EosError):
                outcomes.append(outcome)
                continue
            if before is not None and outcome is not before:
                self._isr_changed(before, outcome)
                changed = True
            outcomes.append(outcome.wire())
        if changed:
            self.forget_states()
        return outcomes

    def _alter_one(
        self, conn: Connection, leader: int, change: IsrChange, liveness: Liveness
    ) -> tuple[StoredPartition | None, StoredPartition | EosError]:
        """(the stored state, the state after the change or the error refusing it)."""
        where = f"{change.topic}/{change.partition}"
        try:
            stored = read_state(conn, change.topic, change.partition)
        except ValueError as exc:
            return None, InternalError(f"{where} has an unreadable state: {exc}")
        if stored is None:
            return None, UnknownTopicOrPartitionError(f"unknown partition {where}")
        if (leader, change.leader_epoch, change.partition_epoch) != (
            stored.leader, stored.leader_epoch, stored.partition_epoch
        ):
            return stored, fenced(
                stored,
                f"{where} is at leader {stored.leader}, leader epoch {stored.leader_epoch}, "
                f"partition epoch {stored.partition_epoch}; the request names leader "
                f"{leader} at {change.leader_epoch}/{change.partition_epoch}",
            )
        try:
            isr = check_isr(stored, change.isr, liveness)
        except EosError as exc:
            return stored, exc
        if isr == stored.isr:
            return stored, stored
        after = compare_and_set(conn, stored, stored.leader, isr)
        if after is None:
            now = read_state(conn, change.topic, change.partition) or stored
            return stored, fenced(now, f"{where} changed while the ISR was being altered")
        return stored, after

    def _isr_changed(self, stored: StoredPartition, after: StoredPartition) -> None:
        self._on_state(after)
        if set(stored.isr) - set(after.isr):
            self.metrics.isr_shrinks.inc()
        if set(after.isr) - set(stored.isr):
            self.metrics.isr_expands.inc()
        log.info("partition %s/%d: ISR %s -> %s (partition epoch %d)", stored.topic,
                 stored.partition, list(stored.isr), list(after.isr), after.partition_epoch,
                 extra={"topic": stored.topic, "partition": stored.partition})  # fmt: skip

    async def _read(self, topic: str, partition: int) -> StoredPartition:
        try:
            stored = await self._db.run(read_state, topic, partition)
        except ValueError as exc:
            raise InternalError(f"{topic}/{partition} has an unreadable state: {exc}") from exc
        if stored is None:
            raise UnknownTopicOrPartitionError(f"unknown partition {topic}/{partition}")
        return stored
