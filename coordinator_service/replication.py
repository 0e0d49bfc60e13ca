"""What storage nodes ask the coordinator about replication (design §7): heartbeats and
AlterPartition. Any instance answers both: the state is in the database.

A heartbeat records that the node is alive (``node_heartbeats``, the time by this
instance's lease clock, which the controller compares with its own) and answers the node's
view of the cluster: every storage node and the state of every partition the node is a
replica of. Nodes learn their roles from these answers (pull), so an answer lost on the way
is repaired by the next beat.

AlterPartition is a leader proposing a new ISR (Kafka's KIP-497). It is accepted only at
the epochs stored now — the leader's own, ``leader_epoch`` and ``partition_epoch`` — and
otherwise answered ``FENCED_LEADER_EPOCH`` with the stored state in the error's details,
so the node catches up without another call. The new ISR must hold the leader and only
replicas, and a replica joins only while it is alive. The write is a compare-and-set on the
partition epoch, like the controller's, so it cannot undo an election made meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Connection

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.election import decide
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.partition_state import (
    Liveness,
    StoredPartition,
    compare_and_set,
    read_heartbeats,
    read_state,
    read_states,
    write_heartbeat,
)
from eos_protocol.coordinator import NodeInfo
from eos_protocol.errors import (
    EosError,
    FencedLeaderEpochError,
    InternalError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.replication import AlterIsrRequest, HeartbeatAnswer, PartitionState

log = logging.getLogger("eos.coordinator.replication")

#: How old a heartbeat answer's partition states may be.
STATES_TTL_S = 0.2


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
        self._cache: tuple[float, list[StoredPartition]] | None = None
        self._reported: set[tuple[str, int]] = set()

    async def heartbeat(
        self, node_id: int, url: str | None, incarnation: str | None = None
    ) -> HeartbeatAnswer:
        """Record the beat (without a URL: the one this coordinator is configured with)
        and answer the node's view of the cluster. A node that restarted leaves every ISR
        first (``restarted``)."""
        url = url or self._nodes.get(node_id, "")
        now = self._clock.now_ms()
        if await self._db.run(write_heartbeat, node_id, url, now, incarnation):
            await self.restarted(node_id)
        states = await self._states()
        return HeartbeatAnswer(
            nodes=[NodeInfo(node_id=n, url=u) for n, u in self._nodes.items()],
            partitions=[s.wire() for s in states if node_id in s.replicas],
        )

    def forget_states(self) -> None:
        """A state changed here: the next heartbeat answer reads them afresh."""
        self._cache = None

    async def _states(self) -> list[StoredPartition]:
        """Every partition's state, read at most once per ``STATES_TTL_S`` for all the
        nodes' heartbeats together (each node beats a few times a second; the answer may
        be that old, the controller's push carries changes at once)."""
        cached = self._cache
        if cached is not None and time.monotonic() - cached[0] < STATES_TTL_S:
            return cached[1]
        states, bad = await self._db.run(read_states)
        for key, reason in bad.items():
            if key not in self._reported:
                self._reported.add(key)
                log.error("partition %s/%d left out of heartbeat answers: %s", key[0], key[1],
                          reason, extra={"topic": key[0], "partition": key[1]})  # fmt: skip
        self._cache = (time.monotonic(), states)
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
        self._cache = None
        for after in changed:
            self._on_state(after)
            self.metrics.isr_shrinks.inc()
        if changed:
            log.warning("node %d restarted: it left the ISR of %d partitions, new leaders "
                        "where it led", node_id, len(changed), extra={"node_id": node_id})

    async def alter_isr(self, topic: str, partition: int, req: AlterIsrRequest) -> PartitionState:
        stored = await self._read(topic, partition)
        if (req.leader, req.leader_epoch, req.partition_epoch) != (
            stored.leader, stored.leader_epoch, stored.partition_epoch
        ):
            raise fenced(
                stored,
                f"{topic}/{partition} is at leader {stored.leader}, leader epoch "
                f"{stored.leader_epoch}, partition epoch {stored.partition_epoch}; the "
                f"request names leader {req.leader} at {req.leader_epoch}/{req.partition_epoch}",
            )
        heartbeats = await self._db.run(read_heartbeats)
        liveness = Liveness(heartbeats, self._clock.now_ms(), self._session_timeout_ms)
        isr = check_isr(stored, req.isr, liveness)
        if isr == stored.isr:
            return stored.wire()
        after = await self._db.run(compare_and_set, stored, stored.leader, isr)
        self._cache = None
        if after is None:
            raise fenced(
                await self._read(topic, partition),
                f"{topic}/{partition} changed while the ISR was being altered",
            )
        self._on_state(after)
        if set(stored.isr) - set(isr):
            self.metrics.isr_shrinks.inc()
        if set(isr) - set(stored.isr):
            self.metrics.isr_expands.inc()
        log.info("partition %s/%d: ISR %s -> %s (partition epoch %d)", topic, partition,
                 list(stored.isr), list(isr), after.partition_epoch,
                 extra={"topic": topic, "partition": partition})
        return after.wire()

    async def _read(self, topic: str, partition: int) -> StoredPartition:
        try:
            stored = await self._db.run(read_state, topic, partition)
        except ValueError as exc:
            raise InternalError(f"{topic}/{partition} has an unreadable state: {exc}") from exc
        if stored is None:
            raise UnknownTopicOrPartitionError(f"unknown partition {topic}/{partition}")
        return stored
