"""A follower's fetch loop for every partition it copies from one leader node: Kafka's
replica fetcher thread, over HTTP, with one long poll per leader node.

A node following thousands of partitions once kept a long poll open per partition; idle,
the cluster spent its cores answering them. Now the partitions followed from one leader
(``follow`` / ``unfollow``, called by the ``ReplicaManager`` as assignments arrive) share
one loop:

1. partitions new to the loop first ask the leader where their latest epoch ended and cut
   their logs there (one ``epoch-ends`` request for all; a log never written under any
   leader has nothing to cut and asks nothing), as ``follower.truncate_for_leader`` says;
2. then one ``fetch-many`` request names every partition at its log end; the leader
   answers when any has frames (or after the wait), the frames are appended byte for
   byte, all made durable, and only then is the next request sent, whose offsets tell the
   leader they are here.

A change of the set (a partition added, or followed in a new epoch) cancels the poll in
flight, so a new partition does not wait out another's long poll. Each partition's error
is its own: it pauses that partition (or sends it back to step 1), never the others. A
leader of an older release, which answers 404 to the batch endpoints, is followed with one
``FollowerFetcher`` per partition, and asked again in the batch way every
``LEGACY_RECHECK_S`` (it may have been upgraded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import httpx
import orjson

from eos_protocol.common import read_answer_json
from eos_protocol.errors import EosError
from eos_protocol.paths import join
from eos_protocol.replica import (
    REPLICA_BATCH_MEDIA_TYPE,
    EpochEndsAnswer,
    ReplicaFetchManyHeader,
    ReplicaFetchPartitionAnswer,
)
from eos_server.internal import internal_headers
from partition_service.log.batch import CorruptBatchError
from partition_service.log.epochs import UNDEFINED
from partition_service.partition import Partition
from partition_service.replication import follower as steps
from partition_service.replication.fetcher import FollowerFetcher

log = logging.getLogger("eos.node.replication")

Key = tuple[str, int]
T = TypeVar("T")

PAUSE_S = 0.1
MAX_BACKOFF_S = 2.0
LEGACY_RECHECK_S = 60.0
#: Codes that say "not now" for one partition: the controller's next assignment decides.
_ASK_AGAIN = frozenset({"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
                        "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE"})  # fmt: skip


class _OlderLeader(Exception):
    """The leader node has no batch endpoints."""


@dataclass(eq=False)
class Followed:
    """One partition of the session: the epoch it is followed in, and where it stands."""

    partition: Partition
    leader_epoch: int
    truncated: bool = False
    retry_at: float = 0.0

    @property
    def key(self) -> Key:
        return (self.partition.topic, self.partition.index)

    def pause(self, seconds: float, *, truncate: bool = False) -> None:
        self.retry_at = time.monotonic() + seconds
        self.truncated = self.truncated and not truncate


class LeaderSession:
    """Copies every partition this node follows from the node at ``leader_url``."""

    def __init__(
        self,
        *,
        node_id: int,
        leader_url: str,
        client: httpx.AsyncClient,
        internal_token: str | None,
        max_wait_ms: int,
        partition_max_bytes: int = 1 << 20,
        max_bytes: int = 10 << 20,
    ) -> None:
        self.node_id = node_id
        self.leader_url = leader_url
        self.followed: dict[Key, Followed] = {}
        self._client = client
        self._internal_token = internal_token
        self._headers = {**internal_headers(internal_token), "content-type": "application/json"}
        self._max_wait_ms = max_wait_ms
        self._partition_max_bytes = partition_max_bytes
        self._max_bytes = max_bytes
        self._changed = asyncio.Event()
        self._rotation = 0
        self._legacy_until = 0.0
        self._legacy: dict[Key, tuple[FollowerFetcher, asyncio.Task[None]]] = {}

    # -- the set of partitions -----------------------------------------------------------
    def follow(self, partition: Partition, leader_epoch: int) -> bool:
        """Copy ``partition`` in ``leader_epoch``; False if it is followed so already."""
        key = (partition.topic, partition.index)
        held = self.followed.get(key)
        if held is not None and held.partition is partition and held.leader_epoch == leader_epoch:
            return False
        self.followed[key] = Followed(partition, leader_epoch)
        self._stop_legacy(key)
        self._changed.set()
        return True

    def unfollow(self, key: Key) -> None:
        if self.followed.pop(key, None) is not None:
            self._stop_legacy(key)
            self._changed.set()

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Rounds until cancelled; a failed request is tried again with backoff."""
        backoff = PAUSE_S
        try:
            while True:
                try:
                    if time.monotonic() < self._legacy_until:
                        self._run_legacy()
                        await self._until_changed(self._legacy_until - time.monotonic())
                        continue
                    self._stop_all_legacy()
                    await self._round()
                    backoff = PAUSE_S
                except _OlderLeader:
                    log.info("the leader at %s has no batch fetch; following its partitions "
                             "one by one", self.leader_url)  # fmt: skip
                    self._legacy_until = time.monotonic() + LEGACY_RECHECK_S
                except (httpx.HTTPError, ValueError) as exc:
                    log.warning("fetch from %s failed (%s); again in %.1fs", self.leader_url,
                                exc, backoff)  # fmt: skip
                    await self._until_changed(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            self._stop_all_legacy()

    async def _round(self) -> None:
        self._changed.clear()
        now = time.monotonic()
        due = [f for f in self.followed.values() if f.retry_at <= now]
        untruncated = [f for f in due if not f.truncated]
        if untruncated:
            await self._truncate(untruncated)
            return
        if not due:
            waits = [f.retry_at - now for f in self.followed.values()]
            await self._until_changed(min(waits) if waits else None)
            return
        await self._fetch(due, now)

    async def _until_changed(self, timeout_s: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=timeout_s)

    async def _unless_changed(self, request: Awaitable[T]) -> T | None:
        """The request's result, or None when the set changed first (it is cancelled)."""
        asked = asyncio.ensure_future(request)
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({asked, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not asked.done():
                asked.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asked
        return asked.result() if not asked.cancelled() else None

    async def _post(self, path: str, body: object, timeout_s: float) -> httpx.Response | None:
        response = await self._unless_changed(self._client.post(
            join(self.leader_url, "internal", "v1", "replicas", path),
            content=orjson.dumps(body), headers=self._headers, timeout=timeout_s,
        ))  # fmt: skip
        if response is None:
            return None
        if response.status_code in (404, 405):
            raise _OlderLeader()
        if response.status_code >= 400:
            raise ValueError(f"HTTP {response.status_code} from the leader: "
                             f"{response.content[:200]!r}")  # fmt: skip
        return response

    # -- step 1: where to cut ------------------------------------------------------------
    async def _truncate(self, untruncated: list[Followed]) -> None:
        asking: dict[Key, Followed] = {}
        for followed in untruncated:
            if followed.partition.engine.epochs.latest_epoch == UNDEFINED:
                followed.truncated = True  # never written under a leader: nothing to cut
            else:
                asking[followed.key] = followed
        if not asking:
            return
        questions = [{"topic": f.partition.topic, "partition": f.partition.index,
                      "epoch": f.partition.engine.epochs.latest_epoch,
                      "leader_epoch": f.leader_epoch} for f in asking.values()]  # fmt: skip
        response = await self._post("epoch-ends", {"partitions": questions}, 30.0)
        if response is None:
            return
        for entry in read_answer_json(EpochEndsAnswer, response.content).partitions:
            answered = asking.get((entry.topic, entry.partition))
            if answered is None or self.followed.get(answered.key) is not answered:
                continue  # not asked, or changed meanwhile
            if entry.error is not None:
                self._on_error(answered, entry.error.code, entry.error.message)
                continue
            engine = answered.partition.engine
            before = engine.log_end_offset
            after = steps.truncate_for_leader(engine, entry.epoch, entry.end_offset)
            if after is None:
                answered.pause(PAUSE_S)  # the leader does not know the epoch yet
                continue
            answered.truncated = True
            if after < before:
                log.info("%s-%d: log cut from %d to %d for leader epoch %d", entry.topic,
                         entry.partition, before, after, answered.leader_epoch)  # fmt: skip

    # -- step 2: copy --------------------------------------------------------------------
    async def _fetch(self, due: list[Followed], now: float) -> None:
        # a different partition first each round, so a byte limit reached by the first
        # ones does not starve the last
        self._rotation = (self._rotation + 1) % len(due)
        due = due[self._rotation:] + due[: self._rotation]
        paused = [f.retry_at - now for f in self.followed.values() if f.retry_at > now]
        wait_ms = self._max_wait_ms if not paused else min(self._max_wait_ms,
                                                           int(min(paused) * 1000))  # fmt: skip
        body = {
            "replica_id": self.node_id, "max_wait_ms": max(wait_ms, 0),
            "max_bytes": self._max_bytes,
            "partitions": [{"topic": f.partition.topic, "partition": f.partition.index,
                            "leader_epoch": f.leader_epoch,
                            "fetch_offset": f.partition.engine.log_end_offset,
                            "max_bytes": self._partition_max_bytes} for f in due],
        }  # fmt: skip
        response = await self._post("fetch-many", body, wait_ms / 1000 + 10)
        if response is None:
            return
        if not response.headers.get("content-type", "").startswith(REPLICA_BATCH_MEDIA_TYPE):
            raise ValueError(f"a fetch answer of type {response.headers.get('content-type')}")
        line, _, frames = response.content.partition(b"\n")
        header = read_answer_json(ReplicaFetchManyHeader, line)
        if sum(entry.bytes for entry in header.partitions) != len(frames):
            raise ValueError("a fetch answer whose frames do not add up to its header")
        asked = {f.key: f for f in due}
        durable: list[tuple[Followed, int]] = []
        touched: list[Partition] = []
        position = 0
        for entry in header.partitions:
            chunk = frames[position : position + entry.bytes]
            position += entry.bytes
            followed = asked.get((entry.topic, entry.partition))
            if followed is None or self.followed.get(followed.key) is not followed:
                continue  # changed meanwhile: what it brought is not for this epoch
            if await self._apply(followed, entry, chunk):
                durable.append((followed, followed.partition.engine.log_end_offset))
            touched.append(followed.partition)
        flushed = await asyncio.gather(
            *(f.partition.committer.wait_durable(end) for f, end in durable),
            return_exceptions=True,
        )
        for (followed, _), outcome in zip(durable, flushed, strict=True):
            if isinstance(outcome, Exception):
                if self.followed.get(followed.key) is followed:  # else deleted, say
                    self._storage_failed(followed, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome  # cancelled: the session is stopping
        for partition in touched:
            partition.notify()

    async def _apply(
        self, followed: Followed, entry: ReplicaFetchPartitionAnswer, chunk: bytes
    ) -> bool:
        """One partition's part of the answer; True when frames were appended (the
        caller waits for them to be durable)."""
        if entry.error is not None:
            self._on_error(followed, entry.error.code, entry.error.message)
            return False
        partition, engine = followed.partition, followed.partition.engine
        partition.leader_log_start = entry.log_start_offset
        if entry.log_start_offset > engine.log_end_offset:
            log.info("%s-%d: the leader's log starts at %d, past this log's end %d; "
                     "starting again there", entry.topic, entry.partition,
                     entry.log_start_offset, engine.log_end_offset)  # fmt: skip
            # no fsync of the old log may be running when its files go
            try:
                await partition.committer.wait_durable(engine.log_end_offset)
            except EosError as exc:  # a failed disk, or the partition deleted meanwhile
                if self.followed.get(followed.key) is followed:
                    self._storage_failed(followed, exc)
                return False
            if self.followed.get(followed.key) is not followed:
                return False  # unfollowed during the wait: its files may be closed
            engine.restart_at(entry.log_start_offset)
            return False
        try:
            appended = steps.apply_fetched(engine, chunk, entry.high_watermark)
        except (CorruptBatchError, ValueError) as exc:
            log.warning("%s-%d: frames from %s not appended (%s); asking again",
                        entry.topic, entry.partition, self.leader_url, exc)  # fmt: skip
            followed.pause(MAX_BACKOFF_S)
            return False
        except (OSError, EosError) as exc:
            self._storage_failed(followed, exc)
            return False
        return appended > 0

    def _storage_failed(self, followed: Followed, exc: Exception) -> None:
        """This replica's storage failed to take a partition's frames (a full or failing
        disk): that partition stops here, and its leader drops this replica from its ISR
        in time, while every other partition of the session goes on (one partition's
        error once ended the session, and with it every partition it copied)."""
        log.error("%s-%d: this replica's storage failed (%s); asking again in %.0fs",
                  followed.partition.topic, followed.partition.index, exc,
                  MAX_BACKOFF_S)  # fmt: skip
        followed.pause(MAX_BACKOFF_S)

    def _on_error(self, followed: Followed, code: str, message: str) -> None:
        where = f"{followed.partition.topic}-{followed.partition.index}"
        if code == "OFFSET_OUT_OF_RANGE":
            log.debug("%s: the leader's log does not reach this log end", where)
            followed.pause(PAUSE_S, truncate=True)
        elif code in _ASK_AGAIN:
            log.debug("%s: the leader answers %s", where, code)
            followed.pause(PAUSE_S)
        else:
            log.warning("%s: the leader answers %s: %s", where, code, message)
            followed.pause(MAX_BACKOFF_S)

    # -- leaders of an older release -----------------------------------------------------
    def _run_legacy(self) -> None:
        for key, followed in self.followed.items():
            running = self._legacy.get(key)
            if running is not None and running[0].leader_epoch == followed.leader_epoch:
                continue
            self._stop_legacy(key)
            fetcher = FollowerFetcher(
                followed.partition, node_id=self.node_id, leader_url=self.leader_url,
                leader_epoch=followed.leader_epoch, client=self._client,
                internal_token=self._internal_token, max_wait_ms=self._max_wait_ms,
            )  # fmt: skip
            self._legacy[key] = (fetcher, asyncio.create_task(fetcher.run()))
        self._changed.clear()

    def _stop_legacy(self, key: Key) -> None:
        running = self._legacy.pop(key, None)
        if running is not None:
            running[1].cancel()

    def _stop_all_legacy(self) -> None:
        for key in list(self._legacy):
            self._stop_legacy(key)
