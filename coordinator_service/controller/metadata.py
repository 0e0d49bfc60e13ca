"""Cluster metadata: the cluster id, storage nodes, topics and where each partition lives.

The coordinator is the metadata authority. A topic's partitions are placed round-robin on
the configured storage nodes (starting at a node picked from the name, so small topics do
not all land on node 1), each on ``replication_factor`` distinct nodes, the first of them
its preferred leader, and recorded in ``topic_partitions``; the reconciler
(``reconciler.py``) then creates each partition on every replica. The
``__consumer_offsets`` topic is placed at the first start of a cluster.

Leaders move (design §7: the controller elects a new one when a leader's node dies), so
the cache of partition states is read again every ``metadata_refresh_ms``, at once when
someone asks (``request_refresh``: a marker answered NOT_LEADER_OR_FOLLOWER), and on a
miss; whoever follows leaders (the marker channel) is told when one has moved. Topic
answers (``GET /v1/topics/{t}``, ``GET /v1/metadata``) are read afresh, so clients follow
leader changes through them. Partitions of one replica never move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from coordinator_service.clock import Clock
from coordinator_service.controller.partition_state import (
    PartitionKey,
    StoredPartition,
    decode_ids,
    encode_ids,
    place_replicas,
    read_states,
)
from coordinator_service.controller.reconciler import Reconciler
from coordinator_service.controller.topic_config import (
    UNLIMITED,
    TopicRetention,
    alter_retention,
    check_alterable,
)
from coordinator_service.controller.topic_deletion import (
    TopicDeleter,
    delete_topic_rows,
    nodes_deleting,
    settle_ms_for,
)
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import cluster, coordinator_instances, topic_partitions, topics
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.coordinator import DeleteTopicResponse, NodeInfo, PartitionInfo, TopicInfo
from eos_protocol.errors import (
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.replication import NO_LEADER

log = logging.getLogger("eos.coordinator.metadata")

TP = topic_partitions
#: The least time between two reads of the partition states, however often asked.
MIN_REFRESH_GAP_S = 0.1


@dataclass(frozen=True)
class TopicReplication:
    """A topic's replication settings, checked against the nodes there are."""

    factor: int
    min_insync: int
    unclean: bool = False

    @classmethod
    def choose(
        cls, factor: int | None, min_insync: int | None, unclean: bool, *, default: int,
        nodes: int,
    ) -> TopicReplication:
        """The settings asked for, defaults filled in; ``INVALID_REQUEST`` when the nodes
        cannot hold them (before anything is written)."""
        rf = default if factor is None else factor
        if rf > nodes:
            origin = "" if factor is not None else " (the coordinator's default)"
            raise InvalidRequestError(
                f"replication factor {rf}{origin} is larger than the number of storage "
                f"nodes ({nodes}): each replica needs a node of its own"
            )
        isr = min(2, rf) if min_insync is None else min_insync
        if not 1 <= isr <= rf:
            raise InvalidRequestError(
                f"min_insync_replicas must be between 1 and the replication factor {rf}, "
                f"not {isr}"
            )
        return cls(rf, isr, unclean)


ONE_REPLICA = TopicReplication(1, 1)


def _insert_topic(
    conn: Connection,
    name: str,
    placement: list[tuple[int, ...]],
    internal: bool,
    now_ms: int,
    replication: TopicReplication = ONE_REPLICA,
    retention: TopicRetention = UNLIMITED,
) -> None:
    deleting = nodes_deleting(conn, name)
    if deleting:
        raise TopicAlreadyExistsError(
            f"topic {name!r} is being deleted: storage node(s) "
            f"{', '.join(map(str, deleting))} have not yet removed its replicas; it can be "
            "created again once they have"
        )
    conn.execute(
        topics.insert().values(
            name=name, partitions=len(placement), internal=internal, created_ms=now_ms,
            replication_factor=replication.factor,
            min_insync_replicas=replication.min_insync,
            unclean_leader_election=replication.unclean,
            retention_ms=retention.ms, retention_bytes=retention.bytes,
        )
    )
    conn.execute(
        TP.insert(),
        [
            {"topic": name, "partition": i, "node_id": replicas[0],
             "replicas": encode_ids(replicas), "isr": encode_ids(replicas)}
            for i, replicas in enumerate(placement)
        ],
    )


def bootstrap(
    conn: Connection,
    node_ids: list[int],
    offsets_partitions: int,
    instance_id: str,
    url: str,
    now_ms: int,
    replication_factor: int = 1,
) -> tuple[str, int]:
    """First-start work (idempotent): cluster id, ``__consumer_offsets``, our instance row.

    ``__consumer_offsets`` gets ``replication_factor`` replicas (at most one per node).
    Returns the cluster id and this instance's numeric id.
    """
    serialize_first_start(conn)
    cluster_id = conn.execute(sa.select(cluster.c.cluster_id)).scalar()
    if cluster_id is None:
        cluster_id = uuid.uuid4().hex[:22]
        conn.execute(cluster.insert().values(id=1, cluster_id=cluster_id, created_ms=now_ms))
    exists = conn.execute(
        sa.select(topics.c.name).where(topics.c.name == CONSUMER_OFFSETS_TOPIC)
    ).first()
    if exists is None and node_ids:
        rf = min(replication_factor, len(node_ids))
        placement = place_replicas(CONSUMER_OFFSETS_TOPIC, offsets_partitions, node_ids, rf)
        _insert_topic(
            conn, CONSUMER_OFFSETS_TOPIC, placement, True, now_ms,
            TopicReplication(rf, min(2, rf)),
        )
    # A restart under the same --instance-id keeps its row (and so its node id).
    known = conn.execute(
        sa.select(coordinator_instances.c.id).where(
            coordinator_instances.c.instance_id == instance_id
        )
    ).scalar()
    if known is not None:
        conn.execute(
            coordinator_instances.update()
            .where(coordinator_instances.c.id == known)
            .values(url=url, started_ms=now_ms)
        )
        return str(cluster_id), int(known)
    instance = conn.execute(
        coordinator_instances.insert().values(instance_id=instance_id, url=url, started_ms=now_ms)
    )
    pk = instance.inserted_primary_key
    assert pk is not None
    return str(cluster_id), int(pk[0])


def _ids(text: str | None, own: int) -> tuple[int, ...]:
    """Replicas or ISR as stored; ``[]`` (an older version's row) or an unreadable list
    reads as the leader alone."""
    fallback = (own,) if own != NO_LEADER else ()
    try:
        return decode_ids(text) or fallback
    except ValueError:
        return fallback


@dataclass(frozen=True)
class CachedPartition:
    """What the cache knows of one partition."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    created: bool
    error: str | None


@dataclass(frozen=True)
class CachedTopic:
    partitions: int
    replication_factor: int = 1
    min_insync_replicas: int = 1
    retention: TopicRetention = UNLIMITED


@dataclass(frozen=True)
class TopicPlacement:
    """A topic and its cached partitions (those the cache holds), by index."""

    name: str
    config: CachedTopic
    partitions: tuple[tuple[int, CachedPartition], ...]


PartitionRow = sa.Row[tuple[str, int, int, bool, str | None, str, str, int]]
TopicRow = sa.Row[tuple[str, int, int, int, int, int]]


def _select_partitions() -> sa.Select[tuple[str, int, int, bool, str | None, str, str, int]]:
    return sa.select(
        TP.c.topic, TP.c.partition, TP.c.node_id, TP.c.created_on_node, TP.c.creation_error,
        TP.c.replicas, TP.c.isr, TP.c.leader_epoch,
    )


def _select_topics() -> sa.Select[tuple[str, int, int, int, int, int]]:
    return sa.select(
        topics.c.name, topics.c.partitions, topics.c.replication_factor,
        topics.c.min_insync_replicas, topics.c.retention_ms, topics.c.retention_bytes,
    )


def _load_all(conn: Connection) -> tuple[list[TopicRow], list[PartitionRow]]:
    return list(conn.execute(_select_topics())), list(conn.execute(_select_partitions()))


def _load_topic(conn: Connection, name: str) -> tuple[list[TopicRow], list[PartitionRow]]:
    found = list(conn.execute(_select_topics().where(topics.c.name == name)))
    rows = list(conn.execute(_select_partitions().where(TP.c.topic == name)))
    return found, rows


class Metadata:
    """Topics, partition placement and leaders, cached; creation on the nodes, retried."""

    def __init__(
        self,
        db: Database,
        *,
        nodes: dict[int, str],
        client: httpx.AsyncClient,
        internal_token: str | None,
        clock: Clock,
        reconcile_interval_ms: int,
        offsets_partitions: int,
        metrics: CoordinatorMetrics | None = None,
        default_replication_factor: int = 1,
        refresh_interval_ms: int = 1_000,
        default_retention: TopicRetention = UNLIMITED,
    ) -> None:
        self._db = db
        self.nodes = dict(sorted(nodes.items()))
        self._clock = clock
        self.offsets_partitions = offsets_partitions
        self.metrics = metrics or CoordinatorMetrics()
        self.default_replication_factor = default_replication_factor
        self.default_retention = default_retention
        self._refresh_interval_s = refresh_interval_ms / 1000
        self.cluster_id = ""
        # Sends partition states to their replicas and waits (the controller's pusher);
        # a replicated topic's creation is answered once its leaders have theirs.
        self.deliver_states: Callable[[list[StoredPartition]], Awaitable[None]] | None = None
        self._partitions: dict[PartitionKey, CachedPartition] = {}
        self._topics: dict[str, CachedTopic] = {}
        # topics created by this instance so far: a refresh whose read may predate one of
        # them must not drop it (see ``refresh``)
        self._created = 0
        #: Changes this instance made to the cache itself (a topic created, a partition's
        #: creation on its node), and how many there were when ``_last_read`` was loaded.
        self._touched = 0
        self._last_read: tuple[list[TopicRow], list[PartitionRow]] | None = None
        self._touched_at_read: int | None = None
        #: Called (on the event loop) after a refresh found a partition's leader moved.
        self.leader_listeners: list[Callable[[], None]] = []
        self._refresh_wanted = asyncio.Event()
        self._counts: dict[str, int] | None = None
        self.reconciler = Reconciler(
            db, nodes=self.nodes, client=client, internal_token=internal_token,
            interval_ms=reconcile_interval_ms, metrics=self.metrics,
            on_state=self._creation_state,
        )
        self.deleter = TopicDeleter(
            db, nodes=self.nodes, client=client, internal_token=internal_token,
            interval_ms=reconcile_interval_ms, clock=clock, metrics=self.metrics,
            settle_ms=settle_ms_for(client.timeout.read),
        )

    # --- lookups -------------------------------------------------------------------------

    def node_info(self, node_id: int) -> NodeInfo:
        """A node's id and URL; the URL is "" for no leader (-1) or an unknown node."""
        return NodeInfo(node_id=node_id, url=self.nodes.get(node_id, ""))

    def _load(self, topic_rows: list[TopicRow], rows: list[PartitionRow]) -> None:
        moved = False
        self._counts = None
        for t in topic_rows:
            self._topics[t.name] = CachedTopic(
                int(t.partitions), int(t.replication_factor), int(t.min_insync_replicas),
                TopicRetention(int(t.retention_ms), int(t.retention_bytes)),
            )  # fmt: skip
        for r in rows:
            key = (r.topic, int(r.partition))
            before = self._partitions.get(key)
            leader = int(r.node_id)
            moved = moved or (before is not None and before.leader != leader)
            self._partitions[key] = CachedPartition(
                leader=leader,
                replicas=_ids(r.replicas, leader),
                isr=_ids(r.isr, leader),
                leader_epoch=int(r.leader_epoch),
                created=bool(r.created_on_node),
                error=r.creation_error,
            )
        if moved:
            for listener in self.leader_listeners:
                listener()

    async def refresh(self) -> None:
        """Read every topic and partition state again. The topic list is replaced only
        when no topic was created here while the read ran: a read that began before the
        creation committed would otherwise drop the new topic from this instance's view
        (and its creator's answer) until the next refresh."""
        created, touched = self._created, self._touched
        topic_rows, rows = await self._db.run(_load_all)
        read = (topic_rows, rows)
        if read == self._last_read and self._touched_at_read == touched == self._touched:
            # nothing changed, in the database or here: the cache is what a load would
            # make (with thousands of partitions, loading each second was most of an
            # idle coordinator's CPU)
            return
        whole = self._created == created
        if whole:
            self._topics = {}
        self._load(topic_rows, rows)
        if whole and len(self._partitions) > len(rows):  # some topic was deleted since
            present = {(r.topic, int(r.partition)) for r in rows}
            self._partitions = {k: v for k, v in self._partitions.items() if k in present}
        self._last_read = read
        self._touched_at_read = touched if self._touched == touched else None

    def request_refresh(self) -> None:
        """Read the partition states again soon (a leader seems to have moved)."""
        self._refresh_wanted.set()

    async def run_refresher(self) -> None:
        """Read the partition states every ``refresh_interval``, or sooner on request."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refresh_wanted.wait(), self._refresh_interval_s)
            self._refresh_wanted.clear()
            try:
                await self.refresh()
            except Exception:  # the database may be away for a while
                log.exception("metadata refresh failed")
            await asyncio.sleep(MIN_REFRESH_GAP_S)  # requests coming in a stream

    async def leader(self, topic: str, partition: int) -> int | None:
        """The node leading ``topic/partition`` (-1: none alive now), or None when there
        is no such partition."""
        cached = self._partitions.get((topic, partition))
        if cached is None:
            await self.refresh()
            cached = self._partitions.get((topic, partition))
        return None if cached is None else cached.leader

    def topic_partition_counts(self) -> dict[str, int]:
        """{topic: partition count} as the cache holds it: the same object until the
        cache changes, so a caller may key its own memo on it (the group coordinator
        resolves subscriptions against it on every heartbeat)."""
        if self._counts is None:
            self._counts = {name: t.partitions for name, t in self._topics.items()}
        return self._counts

    def cached_leader(self, topic: str, partition: int) -> int | None:
        cached = self._partitions.get((topic, partition))
        return None if cached is None else cached.leader

    async def topic(self, name: str) -> TopicInfo:
        """One topic, its state read afresh (another instance's reconciler may have
        created or been refused a partition since, the controller may have moved a
        leader)."""
        await self._reload_topic(name)
        return self._topic_info(name)

    async def placement(self, name: str) -> TopicPlacement:
        """One topic read afresh, as ``topic`` reads it, without a model per partition."""
        await self._reload_topic(name)
        return self._placement(name)

    async def _reload_topic(self, name: str) -> None:
        topic_rows, rows = await self._db.run(_load_topic, name)
        if not topic_rows:
            self._forget(name)  # deleted (by another instance, maybe) since it was cached
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        self._load(topic_rows, rows)

    def _forget(self, name: str) -> None:
        """Drop a topic and its partitions from the cache."""
        if self._topics.pop(name, None) is None:
            return
        self._touched += 1
        self._counts = None
        self._partitions = {k: v for k, v in self._partitions.items() if k[0] != name}

    def _topic_info(self, name: str) -> TopicInfo:
        topic = self._topics[name]
        parts = []
        for p in range(topic.partitions):
            cached = self._partitions.get((name, p))
            if cached is None:
                continue
            parts.append(
                PartitionInfo(
                    partition=p,
                    leader=self.node_info(cached.leader),
                    created_on_node=cached.created,
                    creation_error=None if cached.created else cached.error,
                    replicas=list(cached.replicas),
                    isr=list(cached.isr),
                    leader_epoch=cached.leader_epoch,
                    under_replicated=len(cached.isr) < len(cached.replicas),
                )
            )
        return TopicInfo(
            name=name, partitions=parts, replication_factor=topic.replication_factor,
            min_insync_replicas=topic.min_insync_replicas, retention_ms=topic.retention.ms,
            retention_bytes=topic.retention.bytes,
        )

    async def all_topics(self) -> list[TopicInfo]:
        await self.refresh()
        return [self._topic_info(name) for name in sorted(self._topics)]

    def cached_placements(self) -> list[TopicPlacement]:
        """Every topic as the cache holds it now (read again every
        ``metadata_refresh_ms``), by name: for a view of the whole cluster on every
        request (the console's topics page), which with thousands of partitions cannot
        afford ``all_topics``' database read and a model per partition."""
        return [self._placement(name) for name in sorted(self._topics)]

    def _placement(self, name: str) -> TopicPlacement:
        topic = self._topics[name]
        places = tuple(
            (p, cached) for p in range(topic.partitions)
            if (cached := self._partitions.get((name, p))) is not None
        )  # fmt: skip
        return TopicPlacement(name, topic, places)

    # --- creation ------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool = False,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> TopicInfo:
        if not self.nodes:
            raise InvalidRequestError("no storage nodes are configured")
        replication = TopicReplication.choose(
            replication_factor, min_insync_replicas, unclean_leader_election,
            default=self.default_replication_factor, nodes=len(self.nodes),
        )
        retention = self.default_retention.with_defaults(retention_ms, retention_bytes)
        placement = place_replicas(name, partitions, list(self.nodes), replication.factor)
        self._created += 1
        self._touched += 1
        try:
            await self._db.run(
                _insert_topic, name, placement, False, self._clock.now_ms(), replication,
                retention,
            )  # fmt: skip
        except IntegrityError:
            raise TopicAlreadyExistsError(f"topic {name!r} exists already") from None
        for i, replicas in enumerate(placement):
            self._partitions[(name, i)] = CachedPartition(
                leader=replicas[0], replicas=replicas, isr=replicas, leader_epoch=0,
                created=False, error=None,
            )
        self._topics[name] = CachedTopic(
            partitions, replication.factor, replication.min_insync, retention
        )
        self._counts = None
        await self.reconciler.create_topic_partitions(name)
        if replication.factor > 1 and self.deliver_states is not None:
            states, _ = await self._db.run(read_states, name)
            await self.deliver_states(states)
        if name not in self._topics:  # a refresh that began before the insert ended since
            return await self.topic(name)
        return self._topic_info(name)

    async def alter_retention(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        """Change a topic's retention (the fields given). The nodes learn it with the
        partitions' state in their next heartbeat answer (``topic_config``)."""
        check_alterable(name, retention_ms, retention_bytes)
        await self._db.run(alter_retention, name, retention_ms, retention_bytes)
        return await self.topic(name)

    async def delete_topic(self, name: str) -> DeleteTopicResponse:
        """Delete a topic: gone from the metadata now, its replicas removed by the nodes
        in the background (``topic_deletion``)."""
        nodes = list(self.nodes)
        partitions = await self._db.run(delete_topic_rows, name, nodes, self._clock.now_ms())
        self._forget(name)
        self.deleter.wake()
        log.info("topic %s deleted (%d partitions); its replicas go from nodes %s",
                 name, partitions, nodes)  # fmt: skip
        return DeleteTopicResponse(name=name, partitions=partitions, pending_nodes=nodes)

    def _creation_state(self, key: PartitionKey, created: bool, error: str | None) -> None:
        self._touched += 1
        cached = self._partitions.get(key)
        if cached is not None:
            self._partitions[key] = CachedPartition(
                cached.leader, cached.replicas, cached.isr, cached.leader_epoch, created, error
            )

    async def reconcile_once(self, topic: str | None = None) -> int:
        """One reconciler round (``reconciler.Reconciler.reconcile_once``)."""
        return await self.reconciler.reconcile_once(topic)

    async def run_reconciler(self) -> None:
        await self.reconciler.run_forever()
