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

The reconciler tells a node that is *away* from a node that *refuses*. Away — no
connection, a timeout, a 5xx/503 answer, or credentials the node does not take — is the
node's state: the rest of that node's partitions wait for a later round. Refused — a 4xx
answer in the error envelope, or a name no URL can carry (``eos_protocol.paths.segment``
refuses ``..`` before anything is sent) — is the partition's state: the reason is logged,
counted and stored in ``topic_partitions.creation_error`` (describe shows it), the round
goes on with the other partitions, and that partition is tried again only every
``REFUSED_RETRY_S`` (and once after each start), or at the next round once an operator
clears its ``creation_error``. A topic named ``..``, written by a version that still
accepted it, once stopped every partition created after it: each round stopped at it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database, serialize_first_start
from coordinator_service.db.schema import cluster, coordinator_instances, topic_partitions, topics
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, ErrorEnvelope, read_answer_json
from eos_protocol.coordinator import NodeInfo, PartitionInfo, TopicInfo
from eos_protocol.errors import (
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.paths import join
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.metadata")

TP = topic_partitions

#: How often a partition its node refused is tried again (besides once after each start).
REFUSED_RETRY_S = 300.0
#: Answers that say the node cannot serve now, whatever the partition: try again later.
_AWAY_STATUSES = frozenset({401, 403, 408, 425, 429})

PartitionKey = tuple[str, int]


class Placed(NamedTuple):
    """A ``topic_partitions`` row not yet created on its node."""

    topic: str
    partition: int
    node_id: int
    error: str | None


@dataclass(frozen=True)
class Attempt:
    """What asking a node to create one partition came to: created, refused (``refusal``
    says why, and it is the partition's problem) or neither (``away`` says why, and it
    is the node's problem)."""

    created: bool = False
    refusal: str | None = None
    away: str | None = None


def judge(status: int, content: bytes) -> Attempt:
    """Read a node's answer to ``PUT /internal/v1/partitions/{topic}/{partition}``.

    Only a 4xx carrying the error envelope is the node's verdict on this partition; 5xx,
    timeouts and throttling are transient, 401/403 mean the node refuses this coordinator
    altogether, and an answer without the envelope did not come from a storage node.
    """
    if status == 200:
        return Attempt(created=True)
    if status < 400 or status >= 500 or status in _AWAY_STATUSES:
        return Attempt(away=f"HTTP {status}")
    try:
        error = read_answer_json(ErrorEnvelope, content).error
    except ValueError:
        return Attempt(away=f"HTTP {status} without the error envelope")
    return Attempt(refusal=f"{error.code} (HTTP {status}): {error.message}")


def pending_rows(conn: Connection, topic: str | None) -> list[Placed]:
    """The partitions not yet created on their nodes (of one topic, or of all)."""
    query = sa.select(TP.c.topic, TP.c.partition, TP.c.node_id, TP.c.creation_error).where(
        TP.c.created_on_node == sa.false()
    )
    if topic is not None:
        query = query.where(TP.c.topic == topic)
    return [Placed(r.topic, r.partition, r.node_id, r.creation_error) for r in conn.execute(query)]


def record_attempts(
    conn: Connection, created: list[PartitionKey], refused: dict[PartitionKey, str]
) -> None:
    """Store what a round found: created partitions lose any old refusal."""
    for topic, partition in created:
        conn.execute(
            TP.update()
            .where(TP.c.topic == topic, TP.c.partition == partition)
            .values(created_on_node=True, creation_error=None)
        )
    for (topic, partition), reason in refused.items():
        conn.execute(
            TP.update()
            .where(
                TP.c.topic == topic,
                TP.c.partition == partition,
                TP.c.created_on_node == sa.false(),
            )
            .values(creation_error=reason)
        )


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
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        self._db = db
        self.nodes = dict(sorted(nodes.items()))
        self._client = client
        self._token = internal_token
        self._clock = clock
        self._interval_s = reconcile_interval_ms / 1000
        self.offsets_partitions = offsets_partitions
        self.metrics = metrics or CoordinatorMetrics()
        self.refused_retry_s = REFUSED_RETRY_S
        self.cluster_id = ""
        self._leaders: dict[PartitionKey, int] = {}
        self._topics: dict[str, int] = {}
        # (created on its node, why its node refused it) per partition
        self._created: dict[PartitionKey, tuple[bool, str | None]] = {}
        # monotonic time this instance last asked for a refused partition
        self._refused_tried: dict[PartitionKey, float] = {}
        self._in_flight: set[PartitionKey] = set()
        self._node_trouble: dict[int, str] = {}

    # --- lookups -------------------------------------------------------------------------

    def node_info(self, node_id: int) -> NodeInfo:
        return NodeInfo(node_id=node_id, url=self.nodes.get(node_id, ""))

    def _load_rows(self, rows: list[sa.Row[tuple[str, int, int, bool, str | None]]]) -> None:
        for r in rows:
            self._leaders[(r.topic, r.partition)] = r.node_id
            self._created[(r.topic, r.partition)] = (r.created_on_node, r.creation_error)

    @staticmethod
    def _select_partitions() -> sa.Select[tuple[str, int, int, bool, str | None]]:
        return sa.select(
            TP.c.topic, TP.c.partition, TP.c.node_id, TP.c.created_on_node, TP.c.creation_error
        )

    async def refresh(self) -> None:
        def load(
            conn: Connection,
        ) -> tuple[dict[str, int], list[sa.Row[tuple[str, int, int, bool, str | None]]]]:
            ts = {r.name: r.partitions for r in conn.execute(sa.select(topics))}
            return ts, list(conn.execute(self._select_partitions()))

        self._topics, rows = await self._db.run(load)
        self._load_rows(rows)

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
        """One topic, its creation state read afresh (another instance's reconciler may
        have created or been refused a partition since)."""

        def load(
            conn: Connection,
        ) -> tuple[int | None, list[sa.Row[tuple[str, int, int, bool, str | None]]]]:
            count = conn.execute(
                sa.select(topics.c.partitions).where(topics.c.name == name)
            ).scalar()
            rows = conn.execute(self._select_partitions().where(TP.c.topic == name))
            return count, list(rows)

        count, rows = await self._db.run(load)
        if count is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        self._topics[name] = int(count)
        self._load_rows(rows)
        return self._topic_info(name)

    def _topic_info(self, name: str) -> TopicInfo:
        parts = []
        for p in range(self._topics[name]):
            created, error = self._created.get((name, p), (False, None))
            parts.append(
                PartitionInfo(
                    partition=p,
                    leader=self.node_info(self._leaders[(name, p)]),
                    created_on_node=created,
                    creation_error=None if created else error,
                )
            )
        return TopicInfo(name=name, partitions=parts)

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
            self._created[(name, i)] = (False, None)
        self._topics[name] = partitions
        await self.reconcile_once(topic=name)
        return self._topic_info(name)

    async def _create_on_node(self, topic: str, partition: int, node_id: int) -> Attempt:
        base = self.nodes.get(node_id)
        if base is None:
            return Attempt(refusal=f"node {node_id} is not among this coordinator's nodes")
        try:
            url = join(base, "internal", "v1", "partitions", topic, partition)
        except InvalidRequestError as exc:  # no URL can name it: no node will ever hold it
            return Attempt(refusal=f"{exc.code}: {exc.message}")
        try:
            response = await self._client.put(url, headers=internal_headers(self._token))
        except httpx.HTTPError as exc:
            return Attempt(away=f"{type(exc).__name__}: {exc}")
        return judge(response.status_code, response.content)

    def _note_node(self, node_id: int, trouble: str | None) -> None:
        """Log a node going away or coming back once, not at every round."""
        before = self._node_trouble.get(node_id)
        if trouble is None:
            if before is not None:
                del self._node_trouble[node_id]
                log.info("node %d takes partition creations again", node_id)
        elif before is None:
            self._node_trouble[node_id] = trouble
            log.warning("node %d cannot create partitions now (%s); trying again later",
                        node_id, trouble, extra={"node_id": node_id, "reason": trouble})

    async def _one_node(self, node_id: int, rows: list[Placed]) -> list[tuple[Placed, Attempt]]:
        """Ask one node for its partitions in order; stop at the first sign it is away
        (the rest wait for a later round), but never at a refusal."""
        answers: list[tuple[Placed, Attempt]] = []
        for row in rows:
            attempt = await self._create_on_node(row.topic, row.partition, node_id)
            if attempt.away is not None:
                self._note_node(node_id, attempt.away)
                break
            self._note_node(node_id, None)
            answers.append((row, attempt))
        return answers

    def _due(self, row: Placed, now: float) -> bool:
        if row.error is None:
            return True
        tried = self._refused_tried.get((row.topic, row.partition))
        return tried is None or now - tried >= self.refused_retry_s

    async def reconcile_once(self, topic: str | None = None) -> int:
        """Create on their nodes the partitions not yet created there (of ``topic`` only,
        when given); returns how many are still missing, refused ones left out."""
        rows = await self._db.run(pending_rows, topic)
        now = time.monotonic()
        by_node: dict[int, list[Placed]] = {}
        # never-refused partitions first: a refused one retried must not delay them
        for row in sorted(rows, key=lambda r: (r.error is not None, r.topic, r.partition)):
            key = (row.topic, row.partition)
            if key not in self._in_flight and self._due(row, now):
                by_node.setdefault(row.node_id, []).append(row)
        claimed = {(r.topic, r.partition) for rs in by_node.values() for r in rs}
        self._in_flight |= claimed
        try:
            results = await asyncio.gather(*(self._one_node(n, rs) for n, rs in by_node.items()))
        finally:
            self._in_flight -= claimed
        created: list[PartitionKey] = []
        refused: dict[PartitionKey, str] = {}
        for row, attempt in (answer for answers in results for answer in answers):
            key = (row.topic, row.partition)
            if attempt.created:
                created.append(key)
                self._refused_tried.pop(key, None)
            elif attempt.refusal is not None:
                refused[key] = attempt.refusal
                self._refused_tried[key] = now
                self._report_refusal(row, attempt.refusal)
        if created or refused:
            await self._db.run(record_attempts, created, refused)
        state = {(r.topic, r.partition): r.error for r in rows}
        for key in created:
            self._created[key] = (True, None)
            del state[key]
        for key, reason in refused.items():
            self._created[key] = (False, reason)
            state[key] = reason
        if topic is None:
            self.metrics.partitions_not_created.set(len(state))
            self.metrics.partitions_refused.set(sum(1 for e in state.values() if e))
        return sum(1 for error in state.values() if error is None)

    def _report_refusal(self, row: Placed, reason: str) -> None:
        self.metrics.partition_refusals.labels(node=str(row.node_id)).inc()
        self.metrics.set_aside.labels(loop="reconciler").inc()
        log.error(
            "partition %s/%d was not created on node %d: %s; the other partitions go on, "
            "this one is tried again in %.0f s",
            row.topic, row.partition, row.node_id, reason, self.refused_retry_s,
            extra={"topic": row.topic, "partition": row.partition, "node_id": row.node_id,
                   "reason": reason},
        )

    async def run_reconciler(self) -> None:
        while True:
            try:
                if await self.reconcile_once() == 0:
                    await asyncio.sleep(self._interval_s * 5)
                    continue
            except Exception:
                log.exception("partition reconciliation failed")
            await asyncio.sleep(self._interval_s)
