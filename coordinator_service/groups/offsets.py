"""A group's committed offsets against its partitions' last stable offsets: lag and reset.

The committed offsets live on the storage node leading the group's ``__consumer_offsets``
partition, the bounds of each partition on its leader; the coordinator asks them with the
caller's own credentials, so the nodes judge the caller's rights as they would if it
called them itself (read on the group, describe on each topic). Calls to many partitions
go out side by side, at most ``CONCURRENCY`` at a time; a partition whose leader does not
answer reports no bound (its lag is unknown) instead of failing the whole description.

Lag is measured against the last stable offset, not the high watermark: a read_committed
member can read no further, so records of an open transaction are not lag yet.

A reset is for an empty group (Kafka's rule): the caller holds the group's lock while the
offsets are written, so no member can join between the check and the write.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx
import orjson

from coordinator_service.controller.metadata import Metadata
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.errors import (
    CoordinatorNotAvailableError,
    EosError,
    InvalidRequestError,
    error_for,
)
from eos_protocol.groups import PartitionLag, ResetOffset, ResetOffsetsRequest
from eos_protocol.partitioning import group_offsets_partition
from eos_protocol.paths import join

CONCURRENCY = 32
T = TypeVar("T")
Key = tuple[str, int]


class GroupOffsets:
    """Committed offsets, partition bounds and offset writes, through the nodes."""

    def __init__(self, http: httpx.AsyncClient, metadata: Metadata) -> None:
        self._http = http
        self._md = metadata

    async def _leader_url(self, topic: str, partition: int) -> str:
        leader = await self._md.leader(topic, partition)
        url = self._md.node_info(leader).url if leader is not None and leader >= 0 else ""
        if not url:
            raise CoordinatorNotAvailableError(f"{topic}/{partition} has no live leader now")
        return url

    async def _call(self, method: str, url: str, headers: dict[str, str],
                    body: Any = None, params: dict[str, Any] | None = None) -> Any:
        answer = await self._http.request(
            method, url, headers=headers, params=params,
            content=None if body is None else orjson.dumps(body),
        )
        if answer.status_code != 200:
            try:
                error = answer.json()["error"]
                raise error_for(error["code"], error.get("message", ""))
            except (ValueError, KeyError, TypeError):
                raise CoordinatorNotAvailableError(
                    f"{url} answered {answer.status_code}"
                ) from None
        return orjson.loads(answer.content)

    async def _offsets_url(self, group_id: str) -> str:
        partition = group_offsets_partition(group_id, self._md.offsets_partitions)
        base = await self._leader_url(CONSUMER_OFFSETS_TOPIC, partition)
        return join(base, "v1", "groups", group_id, "offsets")

    async def committed(self, group_id: str, headers: dict[str, str]) -> dict[Key, int]:
        body = await self._call("GET", await self._offsets_url(group_id), headers,
                                params={"require_stable": "false"})
        return {(o["topic"], int(o["partition"])): int(o["offset"]) for o in body["offsets"]}

    async def commit(self, group_id: str, offsets: list[dict[str, Any]],
                     headers: dict[str, str]) -> Any:
        """Commit offsets at the group's offsets node (outside any transaction)."""
        return await self._call("POST", await self._offsets_url(group_id),
                                {**headers, "content-type": "application/json"},
                                body={"offsets": offsets})

    async def bounds(self, topic: str, partition: int, headers: dict[str, str]
                     ) -> dict[str, int]:
        url = join(await self._leader_url(topic, partition), "v1", "partitions", topic,
                   str(partition), "offsets")
        body = await self._call("GET", url, headers)
        return {k: int(body[k]) for k in ("log_start_offset", "high_watermark",
                                          "last_stable_offset")}

    async def lag(self, group_id: str, partitions: Iterable[Key], owners: dict[Key, str],
                  headers: dict[str, str]) -> list[PartitionLag]:
        committed = await self.committed(group_id, headers)
        keys = sorted(set(partitions) | set(committed))

        async def one(key: Key) -> dict[str, int] | None:
            try:
                return await self.bounds(key[0], key[1], headers)
            except (EosError, httpx.HTTPError):
                return None

        found = await _bounded([functools.partial(one, k) for k in keys])
        out = []
        for key, bound in zip(keys, found, strict=True):
            done = committed.get(key)
            lso = None if bound is None else bound["last_stable_offset"]
            lag = None if lso is None else max(0, lso - (done if done is not None else 0))
            out.append(PartitionLag(topic=key[0], partition=key[1], committed_offset=done,
                                    last_stable_offset=lso, lag=lag, owner=owners.get(key)))
        return out

    async def _first_at(self, topic: str, partition: int, start: int, end: int,
                        timestamp_ms: int, headers: dict[str, str]) -> int:
        """The first offset in [start, end) whose record is at or after ``timestamp_ms``
        (end when none is): a binary search of read_committed fetches."""
        base = join(await self._leader_url(topic, partition), "v1", "partitions", topic,
                    str(partition), "records")
        lo, hi = start, end
        while lo < hi:
            mid = (lo + hi) // 2
            body = await self._call("GET", base, headers, params={
                "offset": mid, "max_records": 1, "isolation_level": "read_committed",
            })
            records = body.get("records") or []
            first = records[0] if records else None
            if first is None or int(first["offset"]) >= hi or (
                int(first["timestamp_ms"]) >= timestamp_ms
            ):
                hi = mid
            else:
                lo = int(first["offset"]) + 1
        return lo

    async def reset(self, group_id: str, req: ResetOffsetsRequest, headers: dict[str, str]
                    ) -> list[ResetOffset]:
        """Compute and commit the new offsets of every partition of ``req.topics``."""
        chosen = [req.to_earliest, req.to_latest, req.to_timestamp_ms is not None,
                  req.to_offset is not None]
        if sum(chosen) != 1:
            raise InvalidRequestError(
                "name exactly one of to_earliest, to_latest, to_timestamp_ms, to_offset"
            )
        keys: list[Key] = []
        for name in req.topics:
            info = await self._md.topic(name)  # UNKNOWN_TOPIC_OR_PARTITION when missing
            keys += [(name, p.partition) for p in info.partitions]

        async def target(key: Key) -> int:
            bound = await self.bounds(key[0], key[1], headers)
            start, end = bound["log_start_offset"], bound["last_stable_offset"]
            if req.to_earliest:
                return start
            if req.to_latest:
                return end
            if req.to_offset is not None:
                return min(max(req.to_offset, start), end)
            assert req.to_timestamp_ms is not None
            return await self._first_at(key[0], key[1], start, end, req.to_timestamp_ms,
                                        headers)

        offsets = await _bounded([functools.partial(target, k) for k in keys])
        entries = [{"topic": t, "partition": p, "offset": o}
                   for (t, p), o in zip(keys, offsets, strict=True)]
        await self.commit(group_id, entries, headers)
        return [ResetOffset(topic=t, partition=p, offset=o)
                for (t, p), o in zip(keys, offsets, strict=True)]


async def _bounded(calls: list[Callable[[], Awaitable[T]]]) -> list[T]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(run(c) for c in calls)))
