"""Topic deletion: the topic leaves the metadata at once; its replicas leave the nodes after.

``DELETE /v1/topics/{topic}`` (``Metadata.delete_topic``) removes the topic's rows from
``topics`` and ``topic_partitions`` and records a row per configured storage node in
``topic_deletions``, in one database transaction. From then on every request about the
topic answers UNKNOWN_TOPIC_OR_PARTITION: the metadata no longer has it, the controller
pushes no state for it, the reconciler creates none of it, and a transaction's markers for
it go only to a node that still holds it (a node that no longer does answers
UNKNOWN_TOPIC_OR_PARTITION, counted as written, as Kafka drops markers of deleted topics).

The deleter (``TopicDeleter``, a loop on every coordinator instance, as the reconciler;
asking twice is harmless) then asks each node with a row to remove every replica of those
topics (``POST /internal/v1/topics/delete``, one request per node for all its topics), and
drops the node's row once the node has confirmed with a request sent at least
``settle_s`` after the deletion. The wait is for requests sent before the deletion that
reach a node after its first confirmation (a reconciler's creation, a state push): without
it such a late request could leave a replica with the old topic's leader epoch, which a
topic created later under the same name would then meet. ``settle_s`` is twice the node
timeout, the longest such a request is waited for.

The name cannot be created again while a row of it is left (TOPIC_ALREADY_EXISTS, naming
the nodes still to confirm): so an old replica never meets a new topic of the same name.
A node that is down keeps its row, and the name blocked, until it is back and confirms,
as deletions in Kafka waited for an offline broker before topic ids (KIP-516), which would
let the name be reused at once; they are left for later. A row of a node no longer
configured is dropped (that node is gone from the cluster, and with it the replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import httpx
import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.db.schema import topic_deletions, topic_partitions, topics
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, read_answer_json
from eos_protocol.errors import InvalidRequestError, UnknownTopicOrPartitionError
from eos_protocol.node import MAX_TOPICS_PER_DELETE, DeleteTopicsOnNodeResponse
from eos_protocol.paths import join
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.topic_deletion")

#: A round with nothing left to delete waits this long before looking again: the instance
#: that deletes a topic wakes its own loop at once, the others look only in case it died
#: before its nodes confirmed.
IDLE_WAIT_S = 10.0
#: Answers of a node without the request (an older version during a rolling upgrade).
_NOT_SERVED = frozenset({404, 405})


def delete_topic_rows(conn: Connection, name: str, node_ids: Iterable[int], now_ms: int) -> int:
    """Remove ``name`` from the metadata and record the nodes that must remove its
    replicas; returns how many partitions it had. UNKNOWN_TOPIC_OR_PARTITION when there is
    no such topic (also while it is being deleted); INVALID_REQUEST for an internal one."""
    found = conn.execute(
        sa.select(topics.c.partitions, topics.c.internal).where(topics.c.name == name)
    ).first()
    if found is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
    if found.internal or name == CONSUMER_OFFSETS_TOPIC:
        raise InvalidRequestError(f"{name} is an internal topic: it cannot be deleted")
    conn.execute(topic_partitions.delete().where(topic_partitions.c.topic == name))
    conn.execute(topics.delete().where(topics.c.name == name))
    conn.execute(topic_deletions.delete().where(topic_deletions.c.topic == name))
    rows = [
        {"topic": name, "node_id": node, "deleted_ms": now_ms, "partitions": found.partitions}
        for node in sorted(set(node_ids))
    ]
    if rows:
        conn.execute(topic_deletions.insert(), rows)
    return int(found.partitions)


def nodes_deleting(conn: Connection, name: str) -> list[int]:
    """The nodes still to confirm the deletion of ``name`` (empty: none is under way)."""
    query = sa.select(topic_deletions.c.node_id).where(topic_deletions.c.topic == name)
    return sorted(int(n) for n in conn.execute(query).scalars())


def _pending(conn: Connection) -> list[tuple[str, int, int]]:
    query = sa.select(
        topic_deletions.c.topic, topic_deletions.c.node_id, topic_deletions.c.deleted_ms
    ).order_by(topic_deletions.c.node_id, topic_deletions.c.topic)
    return [(str(r.topic), int(r.node_id), int(r.deleted_ms)) for r in conn.execute(query)]


def _confirmed(conn: Connection, node_id: int, names: list[str]) -> None:
    conn.execute(
        topic_deletions.delete().where(
            topic_deletions.c.node_id == node_id, topic_deletions.c.topic.in_(names)
        )
    )


class TopicDeleter:
    """Asks the nodes to remove the replicas of deleted topics until each has confirmed
    (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        nodes: dict[int, str],
        client: httpx.AsyncClient,
        internal_token: str | None,
        interval_ms: int,
        settle_ms: int,
        clock: Clock,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._db = db
        self._nodes = nodes
        self._client = client
        self._token = internal_token
        self._interval_s = interval_ms / 1000
        self.settle_ms = settle_ms
        self._clock = clock
        self._metrics = metrics
        self._wake = asyncio.Event()
        #: Nodes that answered 404/405 (an older version): said once, asked every round.
        self._unserved: set[int] = set()

    def wake(self) -> None:
        """Start a round now (a topic was just deleted)."""
        self._wake.set()

    async def delete_once(self) -> int:
        """One round: every node with deletions pending asked once, concurrently; returns
        how many (topic, node) deletions are left."""
        pending = await self._db.run(_pending)
        by_node: dict[int, list[tuple[str, int]]] = {}
        for topic, node, deleted_ms in pending:
            by_node.setdefault(node, []).append((topic, deleted_ms))
        gone = [n for n in by_node if n not in self._nodes]
        for node in gone:
            names = [t for t, _ in by_node.pop(node)]
            log.warning("node %d is no longer configured: its deletions of %s are dropped",
                        node, ", ".join(names))  # fmt: skip
            await self._db.run(_confirmed, node, names)
        left = await asyncio.gather(*(self._ask(n, wanted) for n, wanted in by_node.items()))
        return sum(left)

    async def _ask(self, node: int, wanted: list[tuple[str, int]]) -> int:
        """Ask one node for its deletions, in chunks; returns how many are left."""
        left = 0
        for start in range(0, len(wanted), MAX_TOPICS_PER_DELETE):
            chunk = wanted[start : start + MAX_TOPICS_PER_DELETE]
            asked_ms = self._clock.now_ms()
            answered = await self._request(node, [t for t, _ in chunk])
            if answered is None:
                return left + len(wanted) - start
            done = []
            for topic, deleted_ms in chunk:
                if topic not in answered:
                    left += 1
                    continue
                problem = answered[topic]
                if problem is not None:  # a name no node can hold (an older version's)
                    self._metrics.set_aside.labels(loop="topic-deletion").inc()
                    log.error("node %d refused to delete topic %r: %s; not asked again",
                              node, topic, problem)  # fmt: skip
                    done.append(topic)
                elif asked_ms - deleted_ms >= self.settle_ms:
                    done.append(topic)
                else:
                    left += 1  # confirmed, but asked again once the settle time is over
            if done:
                await self._db.run(_confirmed, node, done)
                log.info("node %d removed the replicas of %s", node, ", ".join(done))
        return left

    async def _request(self, node: int, names: list[str]) -> dict[str, str | None] | None:
        """``{topic: refusal or None}`` as the node answered; None when it did not (away,
        or an older version without the request: asked again next round)."""
        try:
            response = await self._client.post(
                join(self._nodes[node], "internal", "v1", "topics", "delete"),
                content=orjson.dumps({"topics": names}),
                headers={**internal_headers(self._token), "content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            log.info("node %d unreachable for topic deletion: %s", node, exc)
            return None
        if response.status_code in _NOT_SERVED:
            if node not in self._unserved:
                self._unserved.add(node)
                log.warning("node %d does not serve topic deletion (HTTP %d, an older "
                            "version?): %s stay until it does", node, response.status_code,
                            ", ".join(names))  # fmt: skip
            return None
        self._unserved.discard(node)
        if response.status_code != 200:
            log.warning("node %d answered topic deletion with HTTP %d: %s", node,
                        response.status_code, response.content[:200].decode(errors="replace"))
            return None
        try:
            answer = read_answer_json(DeleteTopicsOnNodeResponse, response.content)
        except ValueError as exc:
            log.warning("node %d answered topic deletion unreadably: %s", node, exc)
            return None
        return {
            entry.topic: None if entry.error is None else f"{entry.error.code}: "
            f"{entry.error.message}"
            for entry in answer.topics
        }

    async def run_forever(self) -> None:
        while True:
            left = 0
            try:
                left = await self.delete_once()
            except Exception:  # the database may be away for a while
                log.exception("topic deletion round failed")
                left = 1
            wait_s = self._interval_s if left else max(self._interval_s, IDLE_WAIT_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()


def settle_ms_for(node_timeout_s: float | None) -> int:
    """``settle_s``: twice the node timeout (5 s when the client has none)."""
    return int(2 * 1000 * (node_timeout_s or 5.0))


__all__ = ["TopicDeleter", "delete_topic_rows", "nodes_deleting", "settle_ms_for"]
