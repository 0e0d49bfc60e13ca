"""``POST /v1/fetch``: a consumer reads many partitions of this node in one request.

Kafka's consumer sends one Fetch to each broker for all the partitions it reads there; a
consumer of EOS used to send one long poll per partition, and an idle node spent its cores
on the HTTP work of requests that found nothing. Here one request names every partition
at the consumer's position in it, and the per-request work (routing, parsing, the answer)
is paid once per node and round.

Each partition is read as ``GET .../records`` reads it — the same checks (read right on
the topic, the partition here, led here) and the same engine read (``PartitionEngine.read``:
read_committed stops at the last stable offset and leaves out aborted records, control
records never leave) — and answered on its own: an error is that partition's entry,
never the request's.

Kafka's wait rule: the answer leaves at once when a partition has an error, moved past a
gap, or the records found over all partitions reach ``min_bytes``; otherwise the request
parks on one event that every partition's change sets (``Partition.watchers``, as a
follower's fetch-many waits) and reads again after each, until ``max_wait_ms``. The total
``max_bytes`` bounds the answer, but the first partition with records always gets one, so a
consumer moves on even past a record larger than the limit.

Both byte limits count the records' JSON in the answer. Each partition's records are
rendered (orjson) as soon as they are read, and the answer is those renderings joined:
the size is then known for nothing, where counting each record's fields cost as much as
the rendering itself, and only a partition that crosses ``max_bytes`` is rendered again,
cut to fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import APIRouter
from fastapi.responses import Response

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.errors import EosError, OffsetOutOfRangeError
from eos_protocol.fetch_many import FetchManyRequest, FetchManyResponse
from eos_protocol.node import IsolationLevel
from eos_protocol.parsing import collector_paused
from eos_security.access import Caller
from eos_server.envelope import error_responses
from partition_service.context import Node, NodeContext
from partition_service.log.engine import ReadResult
from partition_service.partition import Partition

router = APIRouter(tags=["records"])

#: A record's dict as the engine reads it (and as both fetches answer it).
Record = dict[str, Any]


@dataclass(slots=True)
class _Asked:
    """One partition of the request: what was asked, and the partition that serves it
    (None with ``error`` when the first checks refused it)."""

    topic: str
    partition: int
    offset: int
    max_records: int
    max_bytes: int
    level: IsolationLevel
    target: Partition | None = None
    error: EosError | None = None


@dataclass(slots=True)
class _Pass:
    """One read of every partition: the answer's entries, rendered, and what decides
    whether it leaves now."""

    entries: list[bytes] = field(default_factory=list)
    found_bytes: int = 0  # of the records' JSON
    full: bool = False  # a partition's records were cut to fit: the others get none
    urgent: bool = False  # an error, or a partition moved past a gap without records
    fetched: dict[IsolationLevel, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def ready(self, min_bytes: int) -> bool:
        return self.urgent or self.found_bytes >= min_bytes


def fitting(records: list[Record], budget: int, *, keep_one: bool) -> tuple[int, bytes]:
    """The most leading ``records`` whose JSON takes at most ``budget`` bytes, and that
    JSON; with ``keep_one`` at least one (Kafka's progress rule). A search over prefixes:
    a record's JSON is not known without rendering it, and each rendering is one call."""
    low, high = (1, len(records)) if keep_one else (0, len(records))
    best = orjson.dumps(records[:low])
    while low < high:
        middle = (low + high + 1) // 2
        text = orjson.dumps(records[:middle])
        if len(text) - 2 <= budget:
            low, best = middle, text
        else:
            high = middle - 1
    return low, best


async def _prepare(node: NodeContext, caller: str | None, body: FetchManyRequest) -> list[_Asked]:
    """Each partition with the checks of the one-partition fetch made once: read right
    on its topic (asked once per topic), on this node, led here."""
    refused: dict[str, EosError | None] = {}
    asked: list[_Asked] = []
    for entry in body.partitions:
        one = _Asked(entry.topic, entry.partition, entry.offset, entry.max_records,
                     entry.max_bytes, entry.isolation_level or body.isolation_level)  # fmt: skip
        if entry.topic not in refused:
            try:
                await node.access.require(caller, ResourceType.TOPIC, entry.topic, Operation.READ)
                refused[entry.topic] = None
            except EosError as exc:
                refused[entry.topic] = exc
        one.error = refused[entry.topic]
        if one.error is None:
            try:
                one.target = node.registry.get(entry.topic, entry.partition)
                one.target.role.require_leader()  # consumers read from the leader
            except EosError as exc:
                one.error = exc
        asked.append(one)
    return asked


def _failed(one: _Asked, exc: EosError) -> bytes:
    """The entry of a partition that was not read. An offset out of range says where the
    log is (the consumer resets from it); other errors leave the offsets unknown."""
    engine = one.target.engine if isinstance(exc, OffsetOutOfRangeError) and one.target else None
    return orjson.dumps({
        "topic": one.topic, "partition": one.partition, "records": [],
        "next_offset": one.offset,
        "high_watermark": engine.high_watermark if engine else -1,
        "last_stable_offset": engine.last_stable_offset if engine else -1,
        "log_start_offset": engine.log_start_offset if engine else -1,
        "error": {"code": exc.code, "message": exc.message, "retriable": exc.retriable},
    })  # fmt: skip


def _read_all(asked: list[_Asked], max_bytes: int) -> _Pass:
    """Read every partition once, within ``max_bytes`` of records in all. A partition read
    once the answer is full still has its offset checked and its offsets answered (an
    engine read of 0 bytes), so its error is never held back by another's records."""
    done = _Pass()
    for one in asked:
        left = 0 if done.full else max(max_bytes - done.found_bytes, 0)
        try:
            target, result = _read(one, left)
        except EosError as exc:
            done.entries.append(_failed(one, exc))
            done.errors.append(exc.code)
            done.urgent = True
            continue
        done.entries.append(_entry(done, one, target, result.records, result.next_offset, left))
    return done


def _read(one: _Asked, max_bytes: int) -> tuple[Partition, ReadResult]:
    """The one-partition fetch's engine read, refused as the first checks refused it, or
    if leadership moved while the request waited."""
    if one.error is not None:
        raise one.error
    assert one.target is not None
    one.target.role.require_leader()
    return one.target, one.target.engine.read(
        one.offset,
        max_records=one.max_records,
        max_bytes=min(one.max_bytes, max_bytes),
        read_committed=one.level is IsolationLevel.READ_COMMITTED,
    )


def _entry(done: _Pass, one: _Asked, target: Partition, records: list[Record],
           next_offset: int, budget: int) -> bytes:
    """A read partition's entry, its records cut to ``budget`` bytes if they pass it (and
    the answer then full); ``done`` counts what it holds."""
    text = orjson.dumps(records)
    if len(text) - 2 > budget:
        count, text = fitting(records, budget, keep_one=not done.found_bytes)
        next_offset = records[count - 1]["offset"] + 1 if count else one.offset
        records = records[:count]
        done.full = True
    done.found_bytes += len(text) - 2
    if records:
        done.fetched[one.level] = done.fetched.get(one.level, 0) + len(records)
    elif next_offset > one.offset:
        done.urgent = True  # only a gap: the reader moves past it at once
    engine = target.engine
    head = orjson.dumps({
        "topic": one.topic, "partition": one.partition, "next_offset": next_offset,
        "high_watermark": engine.high_watermark, "last_stable_offset": engine.last_stable_offset,
        "log_start_offset": engine.log_start_offset, "error": None,
    })  # fmt: skip
    return b"".join((head[:-1], b',"records":', text, b"}"))


def _answer(node: NodeContext, done: _Pass) -> Response:
    """The answer of the final pass, its entries joined; its records and errors are
    counted as the one-partition fetch and the error handler count theirs."""
    metrics = node.metrics
    for level, count in done.fetched.items():
        metrics.fetched_records.labels(level.value).inc(count)
    for code in done.errors:
        metrics.errors.labels(code).inc()
    body = b"".join((b'{"partitions":[', b",".join(done.entries), b"]}"))
    return Response(body, media_type="application/json")


@router.post(
    "/v1/fetch",
    operation_id="fetchMany",
    summary="Read records of many partitions in one request (Kafka's Fetch)",
    response_model=FetchManyResponse,
    responses=error_responses("UNAUTHENTICATED"),
)
async def fetch_many(body: FetchManyRequest, node: Node, caller: Caller) -> Response:
    """One entry per partition asked, in that order, each answered as ``GET
    .../records`` answers it or with its own error (needs read on each topic). Answered at
    once when a partition has an error or the records found reach ``min_bytes``, else when
    they do or after ``max_wait_ms``; at most ``max_bytes`` in all, but the first partition
    with records gets at least one."""
    asked = await _prepare(node, caller, body)
    deadline = time.monotonic() + body.max_wait_ms / 1000
    event: asyncio.Event | None = None
    watched = [one.target for one in asked if one.target is not None and one.error is None]
    try:
        while True:
            if event is not None:
                event.clear()  # before the read: a change after it sets the event again
            with collector_paused():  # every record's dict is made and freed in one go
                done = _read_all(asked, body.max_bytes)
                left = deadline - time.monotonic()
                if left <= 0 or done.ready(body.min_bytes):
                    return _answer(node, done)
                del done
            if event is None:
                event = asyncio.Event()
                for target in watched:
                    target.watchers.add(event)
            with contextlib.suppress(TimeoutError):  # then read once more, and answer
                await asyncio.wait_for(event.wait(), timeout=left)
    finally:
        if event is not None:
            for target in watched:
                target.watchers.discard(event)
