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
a retriable code is tried again; any other code is logged and counted as done, as Kafka
does (for instance a partition the node does not have can hold no data of this
transaction). A marker sent twice is harmless, which is what makes all the retrying safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from coordinator_service.clock import Clock
from coordinator_service.node_link import NodeLink
from coordinator_service.transactions.state import TopicPartitionKey
from coordinator_service.transactions.store import LeaseToken
from sdk.protocol.common import TopicPartition
from sdk.protocol.errors import CATALOGUE
from sdk.protocol.node import Marker, MarkerResult, WriteMarkersRequest, WriteMarkersResponse
from sdk.protocol.server import internal_headers

log = logging.getLogger("eos.coordinator.markers")

FENCED = "TRANSACTION_COORDINATOR_FENCED"


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

    def finish(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)


class NodeBusy(Exception):
    """A node did not take all of its markers; back off and send again."""


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
    ) -> None:
        self._nodes = nodes
        self._link = link
        self._headers = internal_headers(internal_token)
        self._clock = clock
        self._backoff_max_s = backoff_max_ms / 1000
        self._batch = batch_partitions
        self.jobs: dict[str, MarkerJob] = {}
        self._wake = {n: asyncio.Event() for n in nodes}
        self._completed: list[MarkerJob] = []
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
            self._wake[node].set()
        return job

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

    def _take_batch(self, node: int) -> list[tuple[MarkerJob, list[TopicPartitionKey]]]:
        batch: list[tuple[MarkerJob, list[TopicPartitionKey]]] = []
        count = 0
        for job in self.jobs.values():
            parts = job.pending.get(node)
            if not parts:
                continue
            chosen = sorted(parts)[: self._batch - count]
            batch.append((job, chosen))
            count += len(chosen)
            if count >= self._batch:
                break
        return batch

    async def _sender(self, node: int) -> None:
        wake = self._wake[node]
        while True:
            await wake.wait()
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
            if any(job.pending.get(node) for job in self.jobs.values()):
                wake.set()

    async def _send(
        self, node: int, batch: list[tuple[MarkerJob, list[TopicPartitionKey]]]
    ) -> None:
        request = WriteMarkersRequest(
            markers=[
                Marker(
                    producer_id=job.producer_id,
                    producer_epoch=job.producer_epoch,
                    coordinator_epoch=job.token.coordinator_epoch,
                    result=job.result,
                    partitions=[TopicPartition(topic=t, partition=p) for t, p in parts],
                )
                for job, parts in batch
            ]
        )
        self.sent_batches += 1
        try:
            status, content = await self._link.post_json(
                f"{self._nodes[node]}/internal/v1/markers",
                request.model_dump_json().encode(),
                self._headers,
            )
        except httpx.HTTPError as exc:
            log.info("node %d unreachable for markers: %s", node, exc)
            raise
        if status != 200:
            log.warning("node %d refused markers: %s %s", node, status,
                        content[:200].decode(errors="replace"))
            raise NodeBusy(f"node {node} answered {status}")
        answer = WriteMarkersResponse.model_validate_json(content)
        errors = {(r.producer_id, r.topic, r.partition): r.error for r in answer.results}
        retry = False
        for job, parts in batch:
            if self.jobs.get(job.transactional_id) is not job:
                continue  # abandoned or replaced while the request was in flight
            pending = job.pending.get(node, set())
            for tp in parts:
                code = errors.get((job.producer_id, tp[0], tp[1]))
                if code == FENCED:
                    log.warning("%s fenced on %s: giving the job up", job.transactional_id, tp)
                    del self.jobs[job.transactional_id]
                    job.finish(False)
                    break
                if code is not None and code in CATALOGUE and CATALOGUE[code].retriable:
                    retry = True
                    continue
                if code is not None:
                    log.warning("marker for %s on %s/%d: %s (counted as written)",
                                job.transactional_id, tp[0], tp[1], code)
                pending.discard(tp)
            else:
                if not pending:
                    job.pending.pop(node, None)
                if not job.pending:
                    self._to_completion(job)
        if retry:
            raise NodeBusy(f"node {node} asked to retry some markers")

    # --- completion ----------------------------------------------------------------------

    async def _completer(self) -> None:
        assert self._on_complete is not None
        while True:
            await self._completed_wake.wait()
            self._completed_wake.clear()
            jobs, self._completed = self._completed, []
            jobs = [j for j in jobs if self.jobs.get(j.transactional_id) is j]
            if not jobs:
                continue
            try:
                results = await self._on_complete(jobs)
            except Exception:
                log.exception("writing Complete* records failed; retrying")
                self._completed.extend(jobs)
                await asyncio.sleep(0.1)
                self._completed_wake.set()
                continue
            for job, ok in zip(jobs, results, strict=True):
                if self.jobs.get(job.transactional_id) is job:
                    del self.jobs[job.transactional_id]
                job.finish(ok)
