"""A follower's fetch loop for one partition: Kafka's replica fetcher, over HTTP.

Started when this node becomes a follower of a leader in an epoch, cancelled when the
assignment changes. It first asks the leader where this replica's latest epoch ended and
cuts its log there (``follower.truncate_for_leader``), then fetches from its log end in a
loop: the frames are appended byte for byte, made durable by the partition's group commit,
and only then is the next fetch sent, whose offset tells the leader they are here.

Errors are the leader's to decide: a leader that does not know the epoch yet, or no longer
leads, is asked again after a short pause (the next assignment, from the controller,
cancels this loop if the leader changed); a connection that fails is retried with backoff.
The loop never ends by itself.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson

from eos_protocol.common import ErrorEnvelope, read_answer_json
from eos_protocol.paths import join
from eos_protocol.replica import (
    FRAMES_MEDIA_TYPE,
    HIGH_WATERMARK_HEADER,
    LOG_START_OFFSET_HEADER,
    EpochEndAnswer,
    ReplicaFetchRequest,
)
from eos_server.internal import internal_headers
from partition_service.log.batch import CorruptBatchError
from partition_service.partition import Partition
from partition_service.replication import follower as steps

log = logging.getLogger("eos.node.replication")

PAUSE_S = 0.1
MAX_BACKOFF_S = 2.0


class FollowerFetcher:
    """Copies one partition from ``leader_url`` while this node follows it in ``epoch``."""

    def __init__(
        self,
        partition: Partition,
        *,
        node_id: int,
        leader_url: str,
        leader_epoch: int,
        client: httpx.AsyncClient,
        internal_token: str | None,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 500,
    ) -> None:
        self.partition = partition
        self.node_id = node_id
        self.leader_url = leader_url
        self.leader_epoch = leader_epoch
        self._client = client
        self._headers = internal_headers(internal_token)
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms

    @property
    def _where(self) -> str:
        return f"{self.partition.topic}-{self.partition.index}"

    async def run(self) -> None:
        backoff = PAUSE_S
        truncated = False
        while True:
            try:
                if not truncated:
                    truncated = await self._truncate()
                else:
                    await self._fetch_once()
                backoff = PAUSE_S
                continue
            except _AskAgain as again:
                log.debug("%s: %s", self._where, again)
                await asyncio.sleep(PAUSE_S)
                truncated = truncated and not again.truncate
                continue
            except (httpx.HTTPError, CorruptBatchError, ValueError) as exc:
                log.warning("%s: fetch from %s failed (%s); again in %.1fs",
                            self._where, self.leader_url, exc, backoff)  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _truncate(self) -> bool:
        engine = self.partition.engine
        url = join(self.leader_url, "internal", "v1", "replicas", engine.topic,
                   engine.partition, "epoch-end")  # fmt: skip
        response = await self._client.get(
            url,
            params={"epoch": engine.epochs.latest_epoch, "leader_epoch": self.leader_epoch},
            headers=self._headers,
        )
        self._raise_for_error(response)
        answer = read_answer_json(EpochEndAnswer, response.content)
        before = engine.log_end_offset
        after = steps.truncate_for_leader(engine, answer.epoch, answer.end_offset)
        if after is None:
            raise _AskAgain(f"the leader does not know epoch {engine.epochs.latest_epoch} yet")
        if after < before:
            log.info("%s: log cut from %d to %d for leader epoch %d",
                     self._where, before, after, self.leader_epoch)  # fmt: skip
        return True

    async def _fetch_once(self) -> None:
        engine = self.partition.engine
        request = ReplicaFetchRequest(
            replica_id=self.node_id, topic=engine.topic, partition=engine.partition,
            leader_epoch=self.leader_epoch, fetch_offset=engine.log_end_offset,
            max_bytes=self._max_bytes, max_wait_ms=self._max_wait_ms,
        )  # fmt: skip
        response = await self._client.post(
            join(self.leader_url, "internal", "v1", "replicas", "fetch"),
            content=orjson.dumps(request.model_dump()),
            headers={**self._headers, "content-type": "application/json"},
            timeout=self._max_wait_ms / 1000 + 10,
        )
        self._raise_for_error(response)
        if not response.headers.get("content-type", "").startswith(FRAMES_MEDIA_TYPE):
            raise ValueError(f"a fetch answer of type {response.headers.get('content-type')}")
        high_watermark = int(response.headers[HIGH_WATERMARK_HEADER])
        leader_start = response.headers.get(LOG_START_OFFSET_HEADER)
        if leader_start is not None:
            self.partition.leader_log_start = int(leader_start)
            if int(leader_start) > engine.log_end_offset:
                log.info("%s: the leader's log starts at %s, past this log's end %d; "
                         "starting again there", self._where, leader_start,
                         engine.log_end_offset)  # fmt: skip
                # no fsync of the old log may be running when its files go
                await self.partition.committer.wait_durable(engine.log_end_offset)
                engine.restart_at(int(leader_start))
                return
        appended = steps.apply_fetched(engine, response.content, high_watermark)
        if appended:
            await self.partition.committer.wait_durable(engine.log_end_offset)
        self.partition.notify()

    def _raise_for_error(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            code = read_answer_json(ErrorEnvelope, response.content).error.code
        except ValueError:
            raise ValueError(f"HTTP {response.status_code} from the leader") from None
        if code == "OFFSET_OUT_OF_RANGE":
            raise _AskAgain("the leader's log does not reach this log end", truncate=True)
        if code in {"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
                    "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE"}:  # fmt: skip
            raise _AskAgain(f"the leader answers {code}")
        raise ValueError(f"the leader answers {code} (HTTP {response.status_code})")


class _AskAgain(Exception):
    """The leader cannot serve this follower yet; ask again soon (``truncate``: starting
    with the epoch question)."""

    def __init__(self, why: str, *, truncate: bool = False) -> None:
        super().__init__(why)
        self.truncate = truncate
