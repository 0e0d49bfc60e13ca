"""The replicated partition state in ``topic_partitions``, and node liveness (design §7).

PostgreSQL is the source of truth for who leads each partition and who is in sync. Every
change of leader or ISR is one conditional statement, ``UPDATE ... WHERE partition_epoch =
<the epoch read>`` (a compare-and-set): of two writers that read the same state — two
coordinators that both think they are the controller, or the controller and a leader's
AlterPartition — exactly one succeeds, and the other reads again. A controller's writes are
also fenced by its lease row, as transaction-log writes are (``transactions/store.py``).

``replicas`` and ``isr`` are JSON lists of node ids (portable to SQLite). A row written by
a coordinator from before replication holds ``[]`` there, read as ``[node_id]``: a replica
set of one, which is what such a partition is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from coordinator_service.db.schema import (
    CONTROLLER_LEASE,
    leases,
    node_heartbeats,
    topic_partitions,
    topics,
)
from eos_protocol.replication import NO_LEADER, PartitionState

TP = topic_partitions
PartitionKey = tuple[str, int]


@functools.lru_cache(maxsize=4096)
def decode_ids(text: str | None) -> tuple[int, ...]:
    """A stored JSON list of node ids; ``ValueError`` when it is anything else. Memoised:
    a cluster's partitions share a handful of replica lists, and every read of all the
    states (heartbeat answers, the metadata cache, the controller) decoded each row's
    two lists again, most of an idle coordinator's work at 5,000 partitions."""
    value = json.loads(text or "[]")
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"not a list of node ids: {text!r}")
    return tuple(value)


def encode_ids(ids: tuple[int, ...] | list[int]) -> str:
    return json.dumps(list(ids), separators=(",", ":"))


def place_replicas(
    name: str, partitions: int, node_ids: list[int], rf: int
) -> list[tuple[int, ...]]:
    """Round-robin placement: partition i on the nodes start+i, start+i+1, ... (distinct
    while ``rf`` is at most the node count); the first is the preferred leader. With one
    replica this is the placement of the versions before replication."""
    start = zlib.crc32(name.encode()) % len(node_ids)
    count = len(node_ids)
    return [
        tuple(node_ids[(start + i + j) % count] for j in range(rf)) for i in range(partitions)
    ]


@dataclass(frozen=True)
class StoredPartition:
    """One partition's row with its topic's replication settings."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    replication_factor: int = 1
    min_insync_replicas: int = 1
    unclean_leader_election: bool = False
    retention_ms: int = -1
    retention_bytes: int = -1

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def replicated(self) -> bool:
        """Elections apply only here: a partition of one replica keeps its only node as
        its leader whatever happens (the behaviour from before replication)."""
        return self.replication_factor > 1 and len(self.replicas) > 1

    def wire(self) -> PartitionState:
        return PartitionState(
            topic=self.topic,
            partition=self.partition,
            leader=self.leader,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            replicas=list(self.replicas),
            isr=list(self.isr),
            min_insync_replicas=self.min_insync_replicas,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
        )

    def changed(self, leader: int, isr: tuple[int, ...]) -> StoredPartition:
        """The state after a change of leader and/or ISR (what ``compare_and_set`` writes)."""
        return dataclasses.replace(
            self,
            leader=leader,
            isr=isr,
            leader_epoch=self.leader_epoch + (1 if leader != self.leader else 0),
            partition_epoch=self.partition_epoch + 1,
        )


StateRow = sa.Row[tuple[str, int, int, int, int, str, str, int, int, bool, int, int]]


def _select() -> sa.Select[tuple[str, int, int, int, int, str, str, int, int, bool, int, int]]:
    return sa.select(
        TP.c.topic, TP.c.partition, TP.c.node_id, TP.c.leader_epoch, TP.c.partition_epoch,
        TP.c.replicas, TP.c.isr, topics.c.replication_factor, topics.c.min_insync_replicas,
        topics.c.unclean_leader_election, topics.c.retention_ms, topics.c.retention_bytes,
    ).join(topics, topics.c.name == TP.c.topic)


def from_row(row: StateRow) -> StoredPartition:
    """A row as a state; ``ValueError`` for a row that does not read."""
    own = (int(row.node_id),) if row.node_id != NO_LEADER else ()
    return StoredPartition(
        topic=row.topic,
        partition=int(row.partition),
        leader=int(row.node_id),
        leader_epoch=int(row.leader_epoch),
        partition_epoch=int(row.partition_epoch),
        replicas=decode_ids(row.replicas) or own,
        isr=decode_ids(row.isr) or own,
        replication_factor=int(row.replication_factor),
        min_insync_replicas=int(row.min_insync_replicas),
        unclean_leader_election=bool(row.unclean_leader_election),
        retention_ms=int(row.retention_ms),
        retention_bytes=int(row.retention_bytes),
    )


def read_states(
    conn: Connection, topic: str | None = None
) -> tuple[list[StoredPartition], dict[PartitionKey, str]]:
    """Every partition's state (of one topic, when given), and the rows that do not read
    with the reason: the callers set those aside and go on with the others."""
    query = _select().order_by(TP.c.topic, TP.c.partition)
    if topic is not None:
        query = query.where(TP.c.topic == topic)
    return _states_of(conn.execute(query))


def _states_of(
    rows: Iterable[StateRow],
) -> tuple[list[StoredPartition], dict[PartitionKey, str]]:
    states: list[StoredPartition] = []
    bad: dict[PartitionKey, str] = {}
    for row in rows:
        try:
            states.append(from_row(row))
        except ValueError as exc:
            bad[(row.topic, int(row.partition))] = str(exc)
    return states, bad


class StatesReader:
    """``read_states`` for a loop that reads every partition again and again (the
    heartbeat answers, a few times a second): the rows are compared with the last read's,
    and the states are built again only when a row changed. Building them (an object and
    two decoded id lists per partition) was most of an idle coordinator's CPU once a
    cluster held thousands of partitions, while the rows themselves come from the
    database driver at little cost. Comparing whole rows, not a version column, means no
    writer can change a state unseen.

    The states returned are shared between reads: callers do not change them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a read runs on a database thread
        self._rows: list[StateRow] | None = None
        self._states: tuple[list[StoredPartition], dict[PartitionKey, str]] = ([], {})

    def __call__(
        self, conn: Connection
    ) -> tuple[list[StoredPartition], dict[PartitionKey, str], bool]:
        """Every partition's state, the rows that do not read, and whether any row
        changed since the last call (always True for the first)."""
        rows = list(conn.execute(_select().order_by(TP.c.topic, TP.c.partition)))
        with self._lock:
            if rows == self._rows:
                return (*self._states, False)
        states = _states_of(rows)
        with self._lock:
            self._rows, self._states = rows, states
        return (*states, True)


def read_state(conn: Connection, topic: str, partition: int) -> StoredPartition | None:
    row = conn.execute(
        _select().where(TP.c.topic == topic, TP.c.partition == partition)
    ).first()
    return None if row is None else from_row(row)


@dataclass(frozen=True)
class ControllerFence:
    """The controller lease a write is conditional on (as ``LeaseToken`` is for the log)."""

    owner: str
    epoch: int
    now_ms: int


def compare_and_set(
    conn: Connection,
    before: StoredPartition,
    leader: int,
    isr: tuple[int, ...],
    fence: ControllerFence | None = None,
) -> StoredPartition | None:
    """Write a new leader and ISR if the row is still at ``before``'s partition epoch (and
    the controller still holds its lease, with ``fence``); the new state, or None when
    someone else changed the row first (read it again)."""
    after = before.changed(leader, isr)
    statement = TP.update().where(
        TP.c.topic == before.topic,
        TP.c.partition == before.partition,
        TP.c.partition_epoch == before.partition_epoch,
    )
    if fence is not None:
        statement = statement.where(
            sa.exists().where(
                leases.c.log_partition == CONTROLLER_LEASE,
                leases.c.owner == fence.owner,
                leases.c.coordinator_epoch == fence.epoch,
                leases.c.expires_at_ms > fence.now_ms,
            )
        )
    result = conn.execute(
        statement.values(
            node_id=after.leader,
            leader_epoch=after.leader_epoch,
            partition_epoch=after.partition_epoch,
            replicas=encode_ids(after.replicas),  # a row of an older version gets its list
            isr=encode_ids(after.isr),
        )
    )
    return after if result.rowcount == 1 else None


# --- liveness ----------------------------------------------------------------------------


def write_heartbeat(
    conn: Connection, node_id: int, url: str, now_ms: int, incarnation: str | None = None
) -> bool:
    """Upsert the node's row (one statement on both databases); True when the node came
    with another incarnation than the stored one: it restarted since its last beat."""
    before = conn.execute(
        sa.select(node_heartbeats.c.incarnation).where(node_heartbeats.c.node_id == node_id)
    ).scalar()
    values = {"node_id": node_id, "url": url, "heartbeat_ms": now_ms, "incarnation": incarnation}
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(node_heartbeats).values(**values)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[node_heartbeats.c.node_id],
            set_={"url": insert.excluded.url, "heartbeat_ms": insert.excluded.heartbeat_ms,
                  "incarnation": insert.excluded.incarnation},
        )
    )
    return before is not None and incarnation is not None and before != incarnation


def write_heartbeats(conn: Connection, beats: Mapping[int, tuple[str, int, str | None]]) -> None:
    """Several nodes' beats (``node_id -> (url, heartbeat_ms, incarnation)``) in one
    transaction, each as ``write_heartbeat`` writes it; a beat older than the stored one
    (written meanwhile by a beat that waited for its own write) leaves the row alone."""
    for node_id, (url, now_ms, incarnation) in beats.items():
        stored = conn.execute(
            sa.select(node_heartbeats.c.heartbeat_ms).where(node_heartbeats.c.node_id == node_id)
        ).scalar()
        if stored is None or int(stored) < now_ms:
            write_heartbeat(conn, node_id, url, now_ms, incarnation)


def read_heartbeats(conn: Connection) -> dict[int, int]:
    rows = conn.execute(sa.select(node_heartbeats.c.node_id, node_heartbeats.c.heartbeat_ms))
    return {int(r.node_id): int(r.heartbeat_ms) for r in rows}


def latest_beats(stored: Mapping[int, int], heard: Mapping[int, int]) -> dict[int, int]:
    """Each node's latest beat: the database's, or this instance's own newer one."""
    beats = dict(stored)
    for node_id, at in heard.items():
        if at > beats.get(node_id, -1):
            beats[node_id] = at
    return beats


@dataclass(frozen=True)
class Liveness:
    """Which nodes are alive at ``now_ms``: heard from within the session timeout. A node
    never heard from counts as alive only while ``unknown_alive`` (a controller's first
    session timeout, so a fresh cluster does not elect before its nodes have reported)."""

    heartbeats: Mapping[int, int]
    now_ms: int
    session_timeout_ms: int
    unknown_alive: bool = False

    def heard_from(self, node_id: int) -> bool:
        return node_id in self.heartbeats

    def alive(self, node_id: int) -> bool:
        beat = self.heartbeats.get(node_id)
        if beat is None:
            return self.unknown_alive
        return self.now_ms - beat <= self.session_timeout_ms
