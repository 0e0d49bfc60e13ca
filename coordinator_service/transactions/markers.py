"""The marker channel: COMMIT/ABORT markers to the storage nodes, batched and retried.

After a Prepare* record is durable the coordinator hands the channel a ``MarkerJob``: the
partitions of the transaction grouped by the node that leads them. Each node has its own
sender task, which sends everything pending for that node in one ``POST
/internal/v1/markers`` (over a ``node_link.NodeLink``: keep-alive HTTP/1.1) and retries
with tenacity's exponential backoff with jitter while the node is unreachable or answers a
retriable error — so a node that is down holds back only its own partitions. When every
partition of a job has acknowledged, the job goes to the completion writer, which writes
the Complete* records of all jobs that finished together in one database transaction and
wakes whoever waits (``wait_for_markers``, ``init``).

Per-partition answers: ``null`` is done; ``TRANSACTION_COORDINATOR_FENCED`` means a newer
coordinator epoch wrote there, so this instance gives the job up (the new owner resumes it);
a retriable code (or no answer for the partition) sets that partition aside for a backoff
of its own while the node's other markers keep going; any other code is logged and counted
as done, as Kafka does (for instance a partition the node does not have can hold no data of
this transaction). A marker sent twice is harmless, which is what makes all the retrying
safe.

One entry must not hold back the rest:

* a partition no URL or request can name (a topic ``..`` recorded by an older version) is
  counted as done with an error before anything is sent — no node can hold it;
* a node that refuses a whole request for its content (400/413/422) gets it again in
  halves until the partition at fault stands alone; that one is counted as done with an
  error (``eos_coordinator_markers_refused``), the others are delivered. Other non-200
  answers (401/403, 5xx) are the node's state and are retried for the whole node;
* a job whose partition is led by a node this coordinator does not know waits (its
  transaction cannot complete) without disturbing the senders of the other nodes;
* a partition with no live leader (-1, design §7) waits for one.

Leaders move (design §7). A partition answered ``NOT_LEADER_OR_FOLLOWER``,
``FENCED_LEADER_EPOCH``, ``UNKNOWN_LEADER_EPOCH`` or ``LEADER_NOT_AVAILABLE`` is set aside
like any retriable answer and the metadata is asked to read the leaders again
(``on_stale_leader``), as it is when a node cannot be reached; when a refresh finds a
leader moved, ``leaders_changed`` moves every pending partition to its current leader's
sender, to be sent there at once.
* a Complete* write that fails is retried one job at a time, so a job that fails every
  time is retried alone with a growing backoff instead of taking its batch with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from coordinator_service.clock import Clock
from coordinator_service.cluster.node_link import NodeLink
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions.state import TopicPartitionKey
from coordinator_service.transactions.store import LeaseToken
from eos_protocol.common import (
    MAX_PARTITIONS_PER_TOPIC,
    ErrorEnvelope,
    TopicPartition,
    read_answer_json,
    topic_name_problem,
)
from eos_protocol.errors import CATALOGUE
from eos_protocol.node import Marker, MarkerResult, WriteMarkersRequest, WriteMarkersResponse
from eos_protocol.paths import join
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.markers")

FENCED = "TRANSACTION_COORDINATOR_FENCED"
#: Answers meaning the marker went to a node that does not lead the partition (now).
STALE_LEADER = frozenset(
    {"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
     "LEADER_NOT_AVAILABLE"}
)
#: The leader of a partition none leads now (eos_protocol.replication.NO_LEADER).
NO_LEADER = -1
#: Answers refusing what a request holds, not the node's state: a smaller one may pass.
CONTENT_REFUSED = frozenset({400, 413, 422})
#: First backoff of a partition that answered a retriable error (doubling up to the max).
PARTITION_RETRY_MIN_S = 0.05
#: First backoff of a Complete* write that failed on its own (doubling up to the max).
COMPLETION_RETRY_MIN_S = 0.1

Batch = list[tuple["MarkerJob", list[TopicPartitionKey]]]


def unaddressable(tp: TopicPartitionKey) -> str | None:
    """Why no node can be sent a marker for ``tp`` (None when one can)."""
    problem = topic_name_problem(tp[0])
    if problem is not None:
        return problem
    if not 0 <= tp[1] < MAX_PARTITIONS_PER_TOPIC:
        return f"partition {tp[1]} is out of range"
    return None


def refusal_reason(status: int, content: bytes) -> str:
    try:
        error = read_answer_json(ErrorEnvelope, content).error
    except ValueError:
        return f"HTTP {status}: {content[:200].decode(errors='replace')}"
    return f"{error.code} (HTTP {status}): {error.message}"


@dataclass(eq=False)
class MarkerJob:
    """The markers of one transaction decision still to be written."""

    transactional_id: str
    token: LeaseToken
    producer_id: int
    producer_epoch: int
    result: MarkerResult
    pending: dict[int, set[TopicPartitionKey]]  # node id -> partitions not yet acknowledged
    created_ms: int
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # partition -> (monotonic time before which it is not sent again, tries so far)
    deferred: dict[TopicPartitionKey, tuple[float, int]] = field(default_factory=dict)
    completion_tries: int = 0

    def finish(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)


class NodeBusy(Exception):
    """A node could not take markers now, whichever they were; back off and send again."""


CompletionHandler = Callable[[list[MarkerJob]], Awaitable[list[bool]]]


class MarkerChannel:
    """Per-node senders plus one completion writer."""

    def __init__(
        self,
        *,
        nodes: dict[int, str],
        link: NodeLink,
        internal_token: str | None,
        clock: Clock,
        backoff_max_ms: int,
        batch_partitions: int,
        metrics: CoordinatorMetrics | None = None,
        leader_of: Callable[[str, int], int | None] | None = None,
        on_stale_leader: Callable[[], None] | None = None,
    ) -> None:
        self._nodes = nodes
        self._leader_of = leader_of
        self._on_stale_leader = on_stale_leader or (lambda: None)
        self._urls = {n: join(url, "internal", "v1", "markers") for n, url in nodes.items()}
        self._link = link
        self._metrics = metrics or CoordinatorMetrics()
        self._headers = internal_headers(internal_token)
        self._clock = clock
        self._backoff_max_s = backoff_max_ms / 1000
        self._batch = batch_partitions
        self.jobs: dict[str, MarkerJob] = {}
        self._wake = {n: asyncio.Event() for n in nodes}
        self._completed: list[MarkerJob] = []
        self._completion_retry: dict[MarkerJob, float] = {}  # job -> monotonic due time
        self._completed_wake = asyncio.Event()
        self._on_complete: CompletionHandler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.sent_batches = 0

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, on_complete: CompletionHandler) -> None:
        self._on_complete = on_complete
        for node in self._nodes:
            self._tasks.append(asyncio.create_task(self._sender(node), name=f"markers-{node}"))
        self._tasks.append(asyncio.create_task(self._completer(), name="markers-complete"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for job in list(self.jobs.values()):
            job.finish(False)
        self.jobs.clear()
        self._completion_retry.clear()

    # --- submitting and abandoning -------------------------------------------------------

    def submit(self, job: MarkerJob) -> MarkerJob:
        """Queue a job; a job already queued for the same decision is kept instead."""
        current = self.jobs.get(job.transactional_id)
        if current is not None:
            same = (
                current.producer_id == job.producer_id
                and current.producer_epoch == job.producer_epoch
                and current.result is job.result
                and current.token == job.token
            )
            if same:
                return current
            current.finish(False)
        self.jobs[job.transactional_id] = job
        job.pending = {n: ps for n, ps in job.pending.items() if ps}
        if not job.pending:
            self._to_completion(job)
        for node in job.pending:
            wake = self._wake.get(node)
            if wake is not None:
                wake.set()
                continue
            if node == NO_LEADER:
                log.info("markers of %r for %s wait for a leader", job.transactional_id,
                         sorted(job.pending[node]))
                self._on_stale_leader()
                continue
            self._metrics.set_aside.labels(loop="markers").inc()
            log.error(
                "markers of %r for %s wait: node %d is not among this coordinator's nodes",
                job.transactional_id, sorted(job.pending[node]), node,
                extra={"transactional_id": job.transactional_id, "node_id": node},
            )
        return job

    def leaders_changed(self) -> None:
        """Move every pending partition whose leader moved to its new leader's sender
        (its own backoff forgotten: the new leader has not refused anything)."""
        if self._leader_of is None:
            return
        woken: set[int] = set()
        for job in self.jobs.values():
            moves: list[tuple[int, int, TopicPartitionKey]] = []
            for node, parts in job.pending.items():
                for tp in parts:
                    leader = self._leader_of(tp[0], tp[1])
                    if leader is not None and leader != node:
                        moves.append((node, leader, tp))
            for old, new, tp in moves:
                job.pending[old].discard(tp)
                job.pending.setdefault(new, set()).add(tp)
                job.deferred.pop(tp, None)
                woken.add(new)
            for node in [n for n, parts in job.pending.items() if not parts]:
                del job.pending[node]
        for node in woken:
            wake = self._wake.get(node)
            if wake is not None:
                wake.set()

    async def drain(self, log_partition: int, timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, for the jobs of a partition about to be handed over
        to finish, so the next owner has fewer markers to send again."""
        waiting = [job.done for job in self.jobs.values()
                   if job.token.log_partition == log_partition]
        if waiting:
            await asyncio.wait([asyncio.shield(done) for done in waiting], timeout=timeout_s)

    def abandon(self, log_partition: int) -> None:
        """Give up the jobs of a partition whose lease this instance has lost."""
        for tid, job in list(self.jobs.items()):
            if job.token.log_partition == log_partition:
                del self.jobs[tid]
                job.finish(False)

    def _to_completion(self, job: MarkerJob) -> None:
        self._completed.append(job)
        self._completed_wake.set()

    # --- metrics -------------------------------------------------------------------------

    def queue_depth(self) -> int:
        """Partitions still waiting for their marker."""
        return sum(len(ps) for job in self.jobs.values() for ps in job.pending.values())

    def oldest_age_ms(self) -> int:
        now = self._clock.now_ms()
        return max((now - job.created_ms for job in self.jobs.values()), default=0)

    # --- sending -------------------------------------------------------------------------

    def _take_batch(self, node: int) -> Batch:
        """Up to ``batch_partitions`` partitions of this node that are due, oldest job
        first; partitions in their own backoff are left for later."""
        now = time.monotonic()
        batch: Batch = []
        count = 0
        for job in self.jobs.values():
            parts = job.pending.get(node)
            if not parts:
                continue
            due = sorted(tp for tp in parts if job.deferred.get(tp, (0.0, 0))[0] <= now)
            chosen = due[: self._batch - count]
            if not chosen:
                continue
            batch.append((job, chosen))
            count += len(chosen)
            if count >= self._batch:
                break
        return batch

    def _wait_s(self, node: int) -> float | None:
        """Seconds until some partition of ``node`` is due (None: nothing is pending)."""
        now = time.monotonic()
        soonest: float | None = None
        for job in self.jobs.values():
            for tp in job.pending.get(node, ()):
                at = job.deferred.get(tp, (0.0, 0))[0]
                if at <= now:
                    return 0.0
                soonest = at if soonest is None else min(soonest, at)
        return None if soonest is None else soonest - now

    async def _sender(self, node: int) -> None:
        wake = self._wake[node]
        while True:
            wait = self._wait_s(node)
            if wait != 0.0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), wait)
            wake.clear()
            retrying = AsyncRetrying(
                wait=wait_random_exponential(multiplier=0.05, max=self._backoff_max_s),
                retry=retry_if_exception_type((NodeBusy, httpx.HTTPError)),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        batch = self._take_batch(node)
                        if batch:
                            await self._send(node, batch)
            except Exception:  # a bug; keep the sender alive and try again later
                log.exception("marker sender for node %d failed", node)
                await asyncio.sleep(self._backoff_max_s)

    async def _send(self, node: int, batch: Batch) -> None:
        """Send one batch; partitions no request can carry are settled first."""
        items: list[tuple[MarkerJob, list[TopicPartitionKey], Marker]] = []
        for job, parts in batch:
            sendable = []
            for tp in parts:
                problem = unaddressable(tp)
                if problem is None:
                    sendable.append(tp)
                else:
                    self._settle(node, job, tp, refused=f"INVALID_REQUEST: {problem}")
            if not sendable:
                continue
            try:
                marker = Marker(
                    producer_id=job.producer_id,
                    producer_epoch=job.producer_epoch,
                    coordinator_epoch=job.token.coordinator_epoch,
                    result=job.result,
                    partitions=[TopicPartition(topic=t, partition=p) for t, p in sendable],
                )
            except ValidationError as exc:
                for tp in sendable:
                    self._settle(node, job, tp, refused=f"INVALID_REQUEST: {exc}")
                continue
            items.append((job, sendable, marker))
        if items:
            await self._post(node, items)

    async def _post(
        self, node: int, items: list[tuple[MarkerJob, list[TopicPartitionKey], Marker]]
    ) -> None:
        request = WriteMarkersRequest(markers=[marker for _, _, marker in items])
        self.sent_batches += 1
        try:
            status, content = await self._link.post_json(
                self._urls[node], request.model_dump_json().encode(), self._headers
            )
        except httpx.HTTPError as exc:
            log.info("node %d unreachable for markers: %s", node, exc)
            self._on_stale_leader()  # it may have died, and another may lead its partitions
            raise
        if status in CONTENT_REFUSED:
            await self._refused(node, [(job, parts) for job, parts, _ in items], status, content)
            return
        if status != 200:
            log.warning("node %d refused markers: %s %s", node, status,
                        content[:200].decode(errors="replace"))
            raise NodeBusy(f"node {node} answered {status}")
        try:
            answer = read_answer_json(WriteMarkersResponse, content)
        except ValidationError as exc:
            log.warning("node %d answered markers with an unreadable body: %s", node, exc)
            raise NodeBusy(f"node {node} answered an unreadable body") from exc
        self._apply(node, items, answer)

    async def _refused(self, node: int, batch: Batch, status: int, content: bytes) -> None:
        """The node refused the request as a whole: send it again in halves until the
        partition at fault stands alone, and count that one as done."""
        flat = [(job, tp) for job, parts in batch for tp in parts]
        if len(flat) == 1:
            job, tp = flat[0]
            self._settle(node, job, tp, refused=refusal_reason(status, content))
            return
        log.warning("node %d refused a request of %d markers (HTTP %d); sending it in halves",
                    node, len(flat), status)
        half = len(flat) // 2
        for piece in (flat[:half], flat[half:]):
            regrouped: Batch = []
            for job, tp in piece:
                if regrouped and regrouped[-1][0] is job:
                    regrouped[-1][1].append(tp)
                else:
                    regrouped.append((job, [tp]))
            await self._send(node, regrouped)

    def _apply(
        self,
        node: int,
        items: list[tuple[MarkerJob, list[TopicPartitionKey], Marker]],
        answer: WriteMarkersResponse,
    ) -> None:
        errors = {(r.producer_id, r.topic, r.partition): r.error for r in answer.results}
        stale = False
        for job, parts, _ in items:
            for tp in parts:
                if self.jobs.get(job.transactional_id) is not job:
                    break  # abandoned, replaced or fenced while the request was in flight
                key = (job.producer_id, tp[0], tp[1])
                code = errors.get(key)
                if code == FENCED:
                    log.warning("%s fenced on %s: giving the job up", job.transactional_id, tp)
                    del self.jobs[job.transactional_id]
                    job.finish(False)
                    break
                if code in STALE_LEADER:
                    stale = True
                if key not in errors or (code in CATALOGUE and CATALOGUE[code].retriable):
                    self._defer(job, tp)
                    continue
                if code is not None:
                    log.warning("marker for %s on %s/%d: %s (counted as written)",
                                job.transactional_id, tp[0], tp[1], code)
                self._settle(node, job, tp)
        if stale:
            self._on_stale_leader()

    def _defer(self, job: MarkerJob, tp: TopicPartitionKey) -> None:
        """Set one partition aside for a backoff of its own; the node's others go on."""
        _, tries = job.deferred.get(tp, (0.0, 0))
        delay = min(self._backoff_max_s, PARTITION_RETRY_MIN_S * 2**tries)
        job.deferred[tp] = (time.monotonic() + delay, tries + 1)

    def _settle(
        self, node: int, job: MarkerJob, tp: TopicPartitionKey, *, refused: str | None = None
    ) -> None:
        """``tp`` needs no more markers of ``job``; a refusal is reported and counted."""
        if self.jobs.get(job.transactional_id) is not job:
            return
        pending = job.pending.get(node)
        if pending is None or tp not in pending:
            return
        if refused is not None:
            self._metrics.markers_refused.inc()
            self._metrics.set_aside.labels(loop="markers").inc()
            log.error(
                "marker %s of %r for %s/%d cannot be written on node %d: %s; counted as "
                "written so the transaction and the other markers go on",
                job.result.value, job.transactional_id, tp[0], tp[1], node, refused,
                extra={"transactional_id": job.transactional_id, "topic": tp[0],
                       "partition": tp[1], "node_id": node, "reason": refused},
            )
        pending.discard(tp)
        job.deferred.pop(tp, None)
        if not pending:
            del job.pending[node]
            if not job.pending:
                self._to_completion(job)

    # --- completion ----------------------------------------------------------------------

    def _completion_wait_s(self) -> float | None:
        if self._completed:
            return 0.0
        if not self._completion_retry:
            return None
        return max(0.0, min(self._completion_retry.values()) - time.monotonic())

    async def _completer(self) -> None:
        while True:
            wait = self._completion_wait_s()
            if wait != 0.0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._completed_wake.wait(), wait)
            self._completed_wake.clear()
            now = time.monotonic()
            jobs, self._completed = self._completed, []
            for job, due in list(self._completion_retry.items()):
                if due <= now:
                    del self._completion_retry[job]
                    jobs.append(job)
            jobs = [j for j in dict.fromkeys(jobs) if self.jobs.get(j.transactional_id) is j]
            if jobs:
                await self._complete(jobs)

    async def _complete(self, jobs: list[MarkerJob]) -> None:
        """Write Complete* for ``jobs`` together; if that fails, one by one, and a job that
        fails alone waits for its own backoff while the others complete."""
        assert self._on_complete is not None
        try:
            results = await self._on_complete(jobs)
        except Exception as exc:
            if len(jobs) > 1:
                log.warning("writing Complete* of %d transactions failed (%s); writing them "
                            "one by one", len(jobs), exc)
                for job in jobs:
                    await self._complete([job])
                return
            job = jobs[0]
            job.completion_tries += 1
            delay = min(self._backoff_max_s,
                        COMPLETION_RETRY_MIN_S * 2 ** (job.completion_tries - 1))
            self._completion_retry[job] = time.monotonic() + delay
            self._metrics.set_aside.labels(loop="markers").inc()
            log.error(
                "writing Complete* of %r failed (try %d): %s; the others go on, this one is "
                "tried again in %.1f s", job.transactional_id, job.completion_tries, exc, delay,
                exc_info=job.completion_tries == 1,
                extra={"transactional_id": job.transactional_id},
            )
            return
        for job, ok in zip(jobs, results, strict=True):
            if self.jobs.get(job.transactional_id) is job:
                del self.jobs[job.transactional_id]
            job.finish(ok)
