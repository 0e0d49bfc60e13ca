"""``POST /v1/producers/describe``: DescribeProducers for many partitions of this node in one
request (Kafka's KIP-664 request, which names many partitions too).

Before a Spark write commits, its driver asks how far every (partition, slot) its tasks
wrote got, and each task asks the same of its partitions before its first batch: with one
``GET .../producers`` per partition, a write to thousands of partitions waited on
thousands of sequential round trips. Here the writer sends one request per leader node.

Each entry is checked and answered as the per-partition GET answers it — describe right on
its topic (asked once per topic), the partition here — and one rule more: the partition
must be led here. The writers ask what the commit is about to expose, which is the
leader's state; a follower's lags behind it by the batches it has not copied yet, and
would fail a correct write's check. (The GET keeps answering on any replica, as it always
did: what that replica holds.) An entry's refusal is its own ``error``, never the
request's. No fast path: a write asks this once per task and once per commit, not per
batch.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.errors import EosError
from eos_protocol.node import (
    DescribeProducersEntry,
    DescribeProducersManyRequest,
    DescribeProducersManyResponse,
)
from eos_security.access import Caller
from eos_server.envelope import error_responses
from partition_service.api.records import json_response, producer_rows
from partition_service.context import Node, NodeContext

router = APIRouter(prefix="/v1", tags=["records"])


async def _rights(
    node: NodeContext, caller: str | None, entries: list[DescribeProducersEntry]
) -> dict[str, EosError | None]:
    """Each topic's refusal of the describe right (None: granted), asked once per topic."""
    refused: dict[str, EosError | None] = {}
    for entry in entries:
        if entry.topic not in refused:
            try:
                await node.access.require(caller, ResourceType.TOPIC, entry.topic,
                                          Operation.DESCRIBE)  # fmt: skip
                refused[entry.topic] = None
            except EosError as exc:
                refused[entry.topic] = exc
    return refused


def _described(node: NodeContext, entry: DescribeProducersEntry, refused: EosError | None
               ) -> dict[str, object]:  # fmt: skip
    """One entry's answer: its producers, or its error (counted as the error handler
    counts a whole answer's)."""
    slot = entry.asked_slot
    try:
        if refused is not None:
            raise refused
        target = node.registry.get(entry.topic, entry.partition)
        target.role.require_leader()
        rows = producer_rows(target, slot)
    except EosError as exc:
        node.metrics.errors.labels(exc.code).inc()
        return {"topic": entry.topic, "partition": entry.partition, "slot": slot,
                "producers": [], "error": exc.envelope()["error"]}  # fmt: skip
    return {"topic": entry.topic, "partition": entry.partition, "slot": slot,
            "producers": rows, "error": None}  # fmt: skip


@router.post(
    "/producers/describe",
    operation_id="describeProducersOfPartitions",
    summary="Producers of many partitions in one request (DescribeProducers, KIP-664)",
    response_model=DescribeProducersManyResponse,
    responses=error_responses("UNAUTHENTICATED"),
)
async def describe_producers_many(
    body: DescribeProducersManyRequest, node: Node, caller: Caller
) -> Response:
    """One entry per entry asked, in that order: the partition's producers as ``GET
    .../producers?slot=`` lists them, or that entry's own error (``UNKNOWN_TOPIC_OR_PARTITION``,
    ``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE``, ``TOPIC_AUTHORIZATION_FAILED``).
    Needs describe on each topic; answered by the partition's leader only."""
    refused = await _rights(node, caller, body.partitions)
    entries = [_described(node, entry, refused[entry.topic]) for entry in body.partitions]
    return json_response({"partitions": entries})
