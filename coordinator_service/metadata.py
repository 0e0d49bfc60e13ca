"""Cluster metadata: the cluster id, storage nodes, topics and where each partition lives.

The coordinator is the metadata authority. A topic's partitions are placed round-robin on
the configured storage nodes (starting at a node picked from the name, so small topics do
not all land on node 1) and recorded in ``topic_partitions``; the coordinator then creates
each partition on its node (``PUT /internal/v1/partitions/...``, idempotent). Nodes may be
down or not yet started when a partition is placed, so the ``created_on_node`` flag drives
a reconciler that keeps trying until every node has its partitions. The
``__consumer_offsets`` topic is placed at the first start of a cluster.

Placement never changes once written, so a partition's leader is cached for good; the
cache is reloaded only on a miss (a topic created through another instance).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import cluster, coordinator_instances, topic_partitions, topics
from sdk.protocol.common import CONSUMER_OFFSETS_TOPIC
from sdk.protocol.coordinator import NodeInfo, PartitionInfo, TopicInfo
from sdk.protocol.errors import (
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from sdk.protocol.server import internal_headers

log = logging.getLogger("eos.coordinator.metadata")

TP = topic_partitions


def place(name: str, partitions: int, node_ids: list[int]) -> list[int]:
    """Round-robin placement: partition i goes to the (start + i)-th node."""
    start = zlib.crc32(name.encode()) % len(node_ids)
    return [node_ids[(start + i) % len(node_ids)] for i in range(partitions)]


def _insert_topic(
    conn: Connection, name: str, nodes: list[int], internal: bool, now_ms: int
) -> None:
    conn.execute(
        topics.insert().values(
            name=name, partitions=len(nodes), internal=internal, created_ms=now_ms
        )
    )
    conn.execute(
        TP.insert(),
        [{"topic": name, "partition": i, "node_id": n} for i, n in enumerate(nodes)],
    )


def bootstrap(
    conn: Connection,
    node_ids: list[int],
    offsets_partitions: int,
    instance_id: str,
    url: str,
    now_ms: int,
) -> tuple[str, int]:
    """First-start work (idempotent): cluster id, ``__consumer_offsets``, our instance row.

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
        placement = place(CONSUMER_OFFSETS_TOPIC, offsets_partitions, node_ids)
        _insert_topic(conn, CONSUMER_OFFSETS_TOPIC, placement, True, now_ms)
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


class Metadata:
    """Topics and partition placement, cached; creation on the nodes, retried."""

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
    ) -> None:
        self._db = db
        self.nodes = dict(sorted(nodes.items()))
        self._client = client
        self._token = internal_token
        self._clock = clock
        self._interval_s = reconcile_interval_ms / 1000
        self.offsets_partitions = offsets_partitions
        self.cluster_id = ""
        self._leaders: dict[tuple[str, int], int] = {}
        self._topics: dict[str, int] = {}
        self._wake = asyncio.Event()

    # --- lookups -------------------------------------------------------------------------

    def node_info(self, node_id: int) -> NodeInfo:
        return NodeInfo(node_id=node_id, url=self.nodes.get(node_id, ""))

    async def refresh(self) -> None:
        def load(conn: Connection) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
            ts = {r.name: r.partitions for r in conn.execute(sa.select(topics))}
            ls = {(r.topic, r.partition): r.node_id for r in conn.execute(sa.select(TP))}
            return ts, ls

        self._topics, self._leaders = await self._db.run(load)

    async def leader(self, topic: str, partition: int) -> int | None:
        """The node leading ``topic/partition``, or None when there is no such partition."""
        node = self._leaders.get((topic, partition))
        if node is None:
            await self.refresh()
            node = self._leaders.get((topic, partition))
        return node

    def cached_leader(self, topic: str, partition: int) -> int | None:
        return self._leaders.get((topic, partition))

    async def topic(self, name: str) -> TopicInfo:
        if name not in self._topics:
            await self.refresh()
        if name not in self._topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return self._topic_info(name)

    def _topic_info(self, name: str) -> TopicInfo:
        return TopicInfo(
            name=name,
            partitions=[
                PartitionInfo(partition=p, leader=self.node_info(self._leaders[(name, p)]))
                for p in range(self._topics[name])
            ],
        )

    async def all_topics(self) -> list[TopicInfo]:
        await self.refresh()
        return [self._topic_info(name) for name in sorted(self._topics)]

    # --- creation ------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int) -> TopicInfo:
        if not self.nodes:
            raise InvalidRequestError("no storage nodes are configured")
        placement = place(name, partitions, list(self.nodes))
        try:
            await self._db.run(_insert_topic, name, placement, False, self._clock.now_ms())
        except IntegrityError:
            raise TopicAlreadyExistsError(f"topic {name!r} exists already") from None
        for i, node in enumerate(placement):
            self._leaders[(name, i)] = node
        self._topics[name] = partitions
        await self.reconcile_once()
        return self._topic_info(name)

    async def _create_on_node(self, topic: str, partition: int, node_id: int) -> bool:
        url = self.nodes.get(node_id)
        if url is None:
            return False
        try:
            response = await self._client.put(
                f"{url}/internal/v1/partitions/{topic}/{partition}",
                headers=internal_headers(self._token),
            )
        except httpx.HTTPError as exc:
            log.debug("node %d unreachable for %s/%d: %s", node_id, topic, partition, exc)
            return False
        return response.status_code == 200

    async def reconcile_once(self) -> int:
        """Create on their nodes the partitions not yet created there; returns how many
        are still missing."""

        def pending(conn: Connection) -> list[tuple[str, int, int]]:
            rows = conn.execute(
                sa.select(TP.c.topic, TP.c.partition, TP.c.node_id).where(
                    TP.c.created_on_node == sa.false()
                )
            )
            return [(r.topic, r.partition, r.node_id) for r in rows]

        missing = await self._db.run(pending)
        by_node: dict[int, list[tuple[str, int]]] = {}
        for topic, partition, node in missing:
            by_node.setdefault(node, []).append((topic, partition))

        async def one_node(node: int, parts: list[tuple[str, int]]) -> list[tuple[str, int]]:
            done: list[tuple[str, int]] = []
            for topic, partition in parts:
                if not await self._create_on_node(topic, partition, node):
                    break  # the node is away: try the rest at the next round
                done.append((topic, partition))
            return done

        results = await asyncio.gather(*(one_node(n, ps) for n, ps in by_node.items()))
        created = [tp for done in results for tp in done]

        def mark(conn: Connection) -> None:
            for topic, partition in created:
                conn.execute(
                    TP.update()
                    .where(TP.c.topic == topic, TP.c.partition == partition)
                    .values(created_on_node=True)
                )

        if created:
            await self._db.run(mark)
        return len(missing) - len(created)

    async def run_reconciler(self) -> None:
        while True:
            try:
                if await self.reconcile_once() == 0:
                    await asyncio.sleep(self._interval_s * 5)
                    continue
            except Exception:
                log.exception("partition reconciliation failed")
            await asyncio.sleep(self._interval_s)
