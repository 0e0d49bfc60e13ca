"""The partition reconciler: creates each placed partition on every one of its replicas.

A topic's partitions are recorded in ``topic_partitions`` first; the coordinator then asks
each replica's node to create them (``PUT /internal/v1/partitions/...``, idempotent). Nodes
may be down or not yet started when a partition is placed, so ``created_replicas`` records
which replicas have it, and the reconciler keeps trying the others; ``created_on_node``
becomes true once every replica has it.

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

Each node is asked for its missing partitions in batches (``POST /internal/v1/partitions``,
``CREATE_CHUNK`` a request, the node fsyncing its data directory once a batch): one request
per partition and replica, one after another, made a topic of a thousand partitions on
three replicas take minutes. The batch answers each partition on its own, and the same
rules apply: a whole request failing as above means the node is away; an entry refused is
that partition's refusal. A node that answers 404 or 405 (a version without the batch,
during a rolling upgrade) is asked one partition at a time (``PUT
/internal/v1/partitions/{topic}/{partition}``) for ``SINGLY_FOR_S`` before the batch is
tried again; a batch refused as a whole for any other reason is asked again partition by
partition at once, so that each partition gets its own verdict.

Two instances may record the same partition's replicas at once; one may then write a list
missing the other's replica. That replica is asked again at a later round, which is
harmless: creation is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.controller.partition_state import PartitionKey, decode_ids, encode_ids
from coordinator_service.db.engine import Database
from coordinator_service.db.schema import topic_partitions
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.common import ErrorEnvelope, read_answer_json
from eos_protocol.errors import InvalidRequestError
from eos_protocol.node import CreatePartitionsResponse
from eos_protocol.paths import join, segment
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.metadata")

TP = topic_partitions

#: How often a partition a node refused is tried again (besides once after each start).
REFUSED_RETRY_S = 300.0
#: How long a topic's creation goes on asking replicas that were busy, slow or claimed by
#: the background round before it answers with what exists; and between two rounds.
CREATE_WAIT_S = 5.0
CREATE_RETRY_S = 0.2
#: Answers that say the node cannot serve now, whatever the partition: try again later.
_AWAY_STATUSES = frozenset({401, 403, 408, 425, 429})
#: Partitions asked of a node in one batched creation, and the time each adds to the
#: node timeout for that request.
CREATE_CHUNK = 500
BATCH_S_PER_PARTITION = 0.02
#: How long a node without the batched creation (an older version) is asked one partition
#: at a time before the batch is tried again (it may have been upgraded since).
SINGLY_FOR_S = 60.0
#: The answers of a node that does not serve ``POST /internal/v1/partitions``: none (404)
#: or only the listing at that path (405).
_NOT_SERVED = frozenset({404, 405})


class Placed(NamedTuple):
    """A ``topic_partitions`` row not yet created on all its replicas."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    created: frozenset[int]
    error: str | None

    @property
    def missing(self) -> list[int]:
        return [r for r in self.replicas if r not in self.created]


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


class Unbatched(NamedTuple):
    """A batched creation the node did not take as a batch: ask it each partition on its
    own. ``remember``: the node serves no batches at all (an older version), so do not
    ask it for one again for a while."""

    reason: str
    remember: bool


def judge_batch(
    status: int, content: bytes, rows: Sequence[Placed]
) -> list[Attempt] | Attempt | Unbatched:
    """Read a node's answer to ``POST /internal/v1/partitions`` for ``rows``: an
    ``Attempt`` per row when the node answered the batch, one ``Attempt`` (away) for the
    request as a whole when the node is away, or ``Unbatched``. A row the answer leaves
    out is neither created nor refused: it is asked again at the next round."""
    if status in _NOT_SERVED:
        return Unbatched(f"HTTP {status}", remember=True)
    if status != 200:
        whole = judge(status, content)
        if whole.away is not None:
            return whole
        return Unbatched(whole.refusal or f"HTTP {status}", remember=False)
    try:
        entries = read_answer_json(CreatePartitionsResponse, content).partitions
    except ValueError:
        return Attempt(away="HTTP 200 without a readable answer to a batched creation")
    answered = {(e.topic, e.partition): e for e in entries}
    attempts = []
    for row in rows:
        entry = answered.get((row.topic, row.partition))
        if entry is None:
            attempts.append(Attempt())
        elif entry.error is not None:
            attempts.append(Attempt(refusal=f"{entry.error.code}: {entry.error.message}"))
        else:
            attempts.append(Attempt(created=True))
    return attempts


def _ids(text: str | None, own: int) -> tuple[int, ...]:
    """A list of node ids; an empty or unreadable one as ``(own,)``, the leader alone."""
    try:
        return decode_ids(text) or (own,)
    except ValueError:
        return (own,)


def _created(text: str | None) -> set[int]:
    """The replicas recorded as having the partition; unreadable: none (asked again)."""
    try:
        return set(decode_ids(text))
    except ValueError:
        return set()


def pending_rows(conn: Connection, topic: str | None) -> list[Placed]:
    """The partitions not yet created on all their replicas (of one topic, or of all)."""
    query = sa.select(
        TP.c.topic, TP.c.partition, TP.c.node_id, TP.c.replicas, TP.c.created_replicas,
        TP.c.creation_error,
    ).where(TP.c.created_on_node == sa.false())
    if topic is not None:
        query = query.where(TP.c.topic == topic)
    placed = []
    for r in conn.execute(query):
        placed.append(
            Placed(r.topic, r.partition, _ids(r.replicas, r.node_id),
                   frozenset(_created(r.created_replicas)), r.creation_error)
        )
    return placed


def record_attempts(
    conn: Connection, created: dict[PartitionKey, set[int]], refused: dict[PartitionKey, str]
) -> set[PartitionKey]:
    """Store what a round found; returns the partitions now created on every replica
    (they lose any old refusal)."""
    complete: set[PartitionKey] = set()
    for (topic, partition), nodes in created.items():
        row = conn.execute(
            sa.select(TP.c.node_id, TP.c.replicas, TP.c.created_replicas).where(
                TP.c.topic == topic, TP.c.partition == partition
            )
        ).first()
        if row is None:
            continue
        replicas = _ids(row.replicas, row.node_id)
        have = _created(row.created_replicas) | nodes
        done = set(replicas) <= have
        values: dict[str, object] = {
            "created_replicas": encode_ids(sorted(have)), "created_on_node": done,
        }
        if done:
            values["creation_error"] = None
            complete.add((topic, partition))
        conn.execute(
            TP.update().where(TP.c.topic == topic, TP.c.partition == partition).values(**values)
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
    return complete


#: Told of each partition's creation state after a round: (key, created, refusal).
CreationListener = Callable[[PartitionKey, bool, str | None], None]


class Reconciler:
    """Asks the replicas' nodes for the partitions they lack, round after round."""

    def __init__(
        self,
        db: Database,
        *,
        nodes: dict[int, str],
        client: httpx.AsyncClient,
        internal_token: str | None,
        interval_ms: int,
        metrics: CoordinatorMetrics,
        on_state: CreationListener,
    ) -> None:
        self._db = db
        self._nodes = nodes
        self._client = client
        self._token = internal_token
        self._interval_s = interval_ms / 1000
        self.metrics = metrics
        self._on_state = on_state
        self.refused_retry_s = REFUSED_RETRY_S
        # monotonic time this instance last asked for a refused partition
        self._refused_tried: dict[PartitionKey, float] = {}
        # Partitions a round is asking their nodes for now; the event is set once the
        # round has recorded the answers.
        self.in_flight: dict[PartitionKey, asyncio.Event] = {}
        # Rounds that have recorded their answers (``_ask_nodes``); a round whose read
        # of the pending rows spans one reads them again (``_fresh_pending``).
        self._recorded = 0
        self._node_trouble: dict[int, str] = {}
        # nodes without the batched creation, and until when (monotonic) they are asked
        # one partition at a time
        self._singly_until: dict[int, float] = {}

    async def _create_on_node(
        self, topic: str, partition: int, node_id: int, replicas: tuple[int, ...]
    ) -> Attempt:
        base = self._nodes.get(node_id)
        if base is None:
            return Attempt(refusal=f"node {node_id} is not among this coordinator's nodes")
        try:
            url = join(base, "internal", "v1", "partitions", topic, partition)
        except InvalidRequestError as exc:  # no URL can name it: no node will ever hold it
            return Attempt(refusal=f"{exc.code}: {exc.message}")
        try:
            # The replicas tell a node of a replicated partition to wait for the
            # controller's assignment rather than lead it alone in the meantime.
            response = await self._client.put(
                url, json={"replicas": list(replicas)}, headers=internal_headers(self._token)
            )
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

    async def _one_node(
        self, node_id: int, rows: list[Placed]
    ) -> list[tuple[Placed, int, Attempt]]:
        """Ask one node for its partitions, in batches of ``CREATE_CHUNK``; stop at the
        first sign it is away (the rest wait for a later round), but never at a refusal."""
        base = self._nodes.get(node_id)
        if base is None:
            refusal = Attempt(refusal=f"node {node_id} is not among this coordinator's nodes")
            return [(row, node_id, refusal) for row in rows]
        answers: list[tuple[Placed, int, Attempt]] = []
        sendable: list[Placed] = []
        for row in rows:
            try:
                segment(row.topic)
            except InvalidRequestError as exc:  # no URL can name it: no node will ever hold it
                answers.append((row, node_id, Attempt(refusal=f"{exc.code}: {exc.message}")))
            else:
                sendable.append(row)
        for start in range(0, len(sendable), CREATE_CHUNK):
            if self._asked_singly(node_id):
                return answers + await self._one_node_singly(node_id, sendable[start:])
            chunk = sendable[start:start + CREATE_CHUNK]
            verdict = await self._create_batch(base, chunk)
            if isinstance(verdict, Attempt):
                self._note_node(node_id, verdict.away)
                break
            if isinstance(verdict, Unbatched):
                if verdict.remember:
                    self._singly_until[node_id] = time.monotonic() + SINGLY_FOR_S
                    log.info("node %d takes no batched partition creation (%s): asking it one "
                             "partition at a time", node_id, verdict.reason)  # fmt: skip
                singly = await self._one_node_singly(node_id, chunk)
                answers += singly
                if len(singly) < len(chunk):  # away in the middle
                    break
                continue
            self._note_node(node_id, None)
            answers += [(row, node_id, a) for row, a in zip(chunk, verdict, strict=True)]
        return answers

    def _asked_singly(self, node_id: int) -> bool:
        until = self._singly_until.get(node_id)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._singly_until[node_id]
        return False

    async def _create_batch(
        self, base: str, rows: list[Placed]
    ) -> list[Attempt] | Attempt | Unbatched:
        body = {"partitions": [{"topic": row.topic, "partition": row.partition,
                                "replicas": list(row.replicas)} for row in rows]}  # fmt: skip
        try:
            response = await self._client.post(
                join(base, "internal", "v1", "partitions"), content=orjson.dumps(body),
                headers={**internal_headers(self._token), "content-type": "application/json"},
                timeout=self._batch_timeout(len(rows)),
            )
        except httpx.HTTPError as exc:
            return Attempt(away=f"{type(exc).__name__}: {exc}")
        return judge_batch(response.status_code, response.content, rows)

    def _batch_timeout(self, partitions: int) -> httpx.Timeout:
        """The node timeout is for one partition; a batch gets ``BATCH_S_PER_PARTITION``
        more for each of its partitions. A node that opens hundreds of partitions while it
        takes the lead of those it already has may need seconds to answer: timed out, it
        was taken for away and the topic's creation was answered without its partitions,
        which it had made all the same. A hung node is still found out as soon by a topic
        of a few partitions."""
        base = self._client.timeout
        if base.read is None:
            return base
        return httpx.Timeout(connect=base.connect, read=base.read + BATCH_S_PER_PARTITION
                             * partitions, write=base.write, pool=base.pool)  # fmt: skip

    async def _one_node_singly(
        self, node_id: int, rows: list[Placed]
    ) -> list[tuple[Placed, int, Attempt]]:
        """Ask one node for its partitions one at a time, in order (a node of a version
        without the batch); stop at the first sign it is away."""
        answers: list[tuple[Placed, int, Attempt]] = []
        for row in rows:
            attempt = await self._create_on_node(row.topic, row.partition, node_id, row.replicas)
            if attempt.away is not None:
                self._note_node(node_id, attempt.away)
                break
            self._note_node(node_id, None)
            answers.append((row, node_id, attempt))
        return answers

    async def create_topic_partitions(self, topic: str) -> int:
        """Rounds for one new topic until every replica has its partition, the only
        nodes in trouble are refusing connections, or ``CREATE_WAIT_S`` has passed;
        returns how many are still missing. One round was not enough for a client that
        produces as soon as the topic's creation is answered: a node that was slow or
        answered 503 once, or a background round that claimed a partition and found its
        node busy, left it missing until the next background round
        (``UNKNOWN_TOPIC_OR_PARTITION`` to a client without retries). A node that is down
        costs no wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CREATE_WAIT_S
        while True:
            missing = await self.reconcile_once(topic)
            claims = {claim for key, claim in list(self.in_flight.items()) if key[0] == topic}
            for claim in claims:
                await claim.wait()  # the background round's answer is this topic's too
            if not missing or loop.time() + CREATE_RETRY_S > deadline:
                return missing
            if claims:
                continue  # their answers are recorded: count again at once
            if self._troubled_nodes_are_down():
                return missing
            await asyncio.sleep(CREATE_RETRY_S)

    def _troubled_nodes_are_down(self) -> bool:
        """Whether every node that failed a creation lately refused the connection (no
        process there), rather than answering slowly or 503 (busy: worth asking again)."""
        troubles = self._node_trouble.values()
        return bool(troubles) and all(t.startswith(f"{httpx.ConnectError.__name__}:")
                                      for t in troubles)

    def _due(self, row: Placed, now: float) -> bool:
        if row.error is None:
            return True
        tried = self._refused_tried.get((row.topic, row.partition))
        return tried is None or now - tried >= self.refused_retry_s

    async def reconcile_once(self, topic: str | None = None) -> int:
        """Create on their replicas the partitions not yet created there (of ``topic``
        only, when given); returns how many are still missing, refused ones left out."""
        rows = await self._fresh_pending(topic)
        now = time.monotonic()
        by_node: dict[int, list[Placed]] = {}
        claimed: set[PartitionKey] = set()
        # never-refused partitions first: a refused one retried must not delay them
        for row in sorted(rows, key=lambda r: (r.error is not None, r.topic, r.partition)):
            key = (row.topic, row.partition)
            if key not in self.in_flight and self._due(row, now):
                claimed.add(key)
                for node in row.missing:
                    by_node.setdefault(node, []).append(row)
        claim = asyncio.Event()
        self.in_flight.update(dict.fromkeys(claimed, claim))
        try:
            return await self._ask_nodes(topic, rows, by_node, now)
        finally:
            for key in claimed:
                del self.in_flight[key]
            claim.set()

    async def _fresh_pending(self, topic: str | None) -> list[Placed]:
        """The pending rows, read again while another round recorded its answers during
        the read. Such a read may predate the record and the other round's claims be gone
        by its end: this round would then claim partitions just created and ask their
        nodes again (a thousand-partition topic, twice over). A round records and drops
        its claims with no await between, so a read that ends before the record still
        meets the claims. Rounds that record all the time get a stale read at the fifth
        try rather than none: asking a node again is harmless, creation is idempotent."""
        for _ in range(4):
            seen = self._recorded
            rows = await self._db.run(pending_rows, topic)
            if seen == self._recorded:
                return rows
        return await self._db.run(pending_rows, topic)

    async def _ask_nodes(
        self, topic: str | None, rows: list[Placed], by_node: dict[int, list[Placed]], now: float
    ) -> int:
        """The body of a reconcile round: ask, record the answers, count what is left."""
        results = await asyncio.gather(*(self._one_node(n, rs) for n, rs in by_node.items()))
        created: dict[PartitionKey, set[int]] = {}
        refused: dict[PartitionKey, str] = {}
        for row, node, attempt in (answer for answers in results for answer in answers):
            key = (row.topic, row.partition)
            if attempt.created:
                created.setdefault(key, set()).add(node)
            elif attempt.refusal is not None:
                refused[key] = attempt.refusal
                self._refused_tried[key] = now
                self._report_refusal(row, node, attempt.refusal)
        complete: set[PartitionKey] = set()
        if created or refused:
            complete = await self._db.run(record_attempts, created, refused)
            self._recorded += 1
        state = {(r.topic, r.partition): r.error for r in rows}
        for key in complete:
            self._refused_tried.pop(key, None)
            self._on_state(key, True, None)
            del state[key]
        for key, reason in refused.items():
            if key in state:
                self._on_state(key, False, reason)
                state[key] = reason
        if topic is None:
            self.metrics.partitions_not_created.set(len(state))
            self.metrics.partitions_refused.set(sum(1 for e in state.values() if e))
        return sum(1 for error in state.values() if error is None)

    def _report_refusal(self, row: Placed, node: int, reason: str) -> None:
        self.metrics.partition_refusals.labels(node=str(node)).inc()
        self.metrics.set_aside.labels(loop="reconciler").inc()
        log.error(
            "partition %s/%d was not created on node %d: %s; the other partitions go on, "
            "this one is tried again in %.0f s",
            row.topic, row.partition, node, reason, self.refused_retry_s,
            extra={"topic": row.topic, "partition": row.partition, "node_id": node,
                   "reason": reason},
        )

    async def run_forever(self) -> None:
        while True:
            try:
                if await self.reconcile_once() == 0:
                    await asyncio.sleep(self._interval_s * 5)
                    continue
            except Exception:
                log.exception("partition reconciliation failed")
            await asyncio.sleep(self._interval_s)
