"""The multi-partition produce, ``POST /v1/produce``: the batches of many partitions in one
request, each appended and answered on its own (docs/design.md §4, "Produce to many
partitions").

Why a request of its own and not a loop of single produces: the HTTP work of a request
(reading and parsing the body, routing, the answer) is most of what a small batch costs a
node, and a keyed producer writes to every partition at once; Kafka's Produce request
carries every partition a client has ready for one broker for the same reason.

Each batch goes through the very steps of the single produce (``records.append_batch``):
the topic's write right, the producer fields, KIP-890 verification of a batch that opens a
transaction, idempotence and fencing, acks. Batches are appended in the order of the
request, and their waits (for the disk, for the in-sync replicas, for the coordinator's
verification) overlap. A batch's refusal is its own ``error``; only a request that is
malformed as a whole (no batch, a partition named twice, a field of the wrong type) is
refused, and then nothing is written.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import ErrorBody
from eos_protocol.errors import EosError
from eos_protocol.parsing import collector_paused
from eos_protocol.produce_many import (
    PartitionBatch,
    PartitionProduced,
    ProduceManyRequest,
    ProduceManyResponse,
)
from eos_security.access import Caller, principal_of
from eos_server.envelope import error_responses
from eos_server.fastpath import FastCall, fast_path
from partition_service.api.records import append_batch
from partition_service.context import Node, NodeContext
from partition_service.log.engine import Row

router = APIRouter(prefix="/v1", tags=["records"])

#: A batch ready to append: its rows, or the error that refused it before any append.
Prepared = list[Row] | EosError | None


async def produce_many(
    body: ProduceManyRequest, node: Node, caller: Caller
) -> ProduceManyResponse:
    """Each batch is answered on its own, in the order of the request: its offsets, or
    its error (a refused batch changes nothing and fails no other). A batch needs write
    on its topic, and a batch that opens a transaction write on its transactional id."""
    return await _produce(node, body, caller, body_bytes=None)


router.add_api_route(
    "/produce",
    produce_many,
    methods=["POST"],
    operation_id="produceToPartitions",
    summary="Append batches to many partitions (one request per node)",
    response_model=ProduceManyResponse,
    responses=error_responses("INVALID_REQUEST", "MESSAGE_TOO_LARGE", "UNAUTHENTICATED"),
)


@fast_path(produce_many, ProduceManyRequest)
async def produce_many_fast(call: FastCall[ProduceManyRequest]) -> ProduceManyResponse:
    """The route without FastAPI's per-request work (``eos_server/fastpath.py``); the
    batches are parsed and turned into rows with the cyclic collector paused, as the
    single produce's fast path does."""
    node: NodeContext = call.state.node
    return await _produce(node, call.body(), principal_of(call.scope), body_bytes=len(call.raw))


FAST_PATHS = (produce_many_fast,)


async def _produce(
    node: NodeContext, body: ProduceManyRequest, caller: str | None, *, body_bytes: int | None
) -> ProduceManyResponse:
    batches = body.batches
    with collector_paused():
        prepared = [_prepare(node, batch, caller, body_bytes) for batch in batches]
        # Free the per-record models now, while the collector is paused (a batch whose
        # right is still to be awaited keeps them, to be made into rows after).
        for batch, rows in zip(batches, prepared, strict=True):
            if rows is not None:
                batch.records = []
    outcomes = await asyncio.gather(
        *(
            _one(node, batch, rows, caller, body_bytes)
            for batch, rows in zip(batches, prepared, strict=True)
        )
    )
    return ProduceManyResponse.model_construct(batches=outcomes)


def _prepare(
    node: NodeContext, batch: PartitionBatch, caller: str | None, body_bytes: int | None
) -> Prepared:
    """The batch's rows, found without waiting; None when its write right must be awaited
    first (the caller is not certainly admitted yet: the right is asked before anything
    else, so a caller without it learns nothing of the partition)."""
    if not node.access.allowed(caller, ResourceType.TOPIC, batch.topic, Operation.WRITE):
        return None
    try:
        return node.registry.get(batch.topic, batch.partition).validate_rows(
            batch, body_bytes=body_bytes
        )
    except EosError as exc:
        return exc


async def _one(
    node: NodeContext,
    batch: PartitionBatch,
    prepared: Prepared,
    caller: str | None,
    body_bytes: int | None,
) -> PartitionProduced:
    """One batch through the single produce's steps; its entry in the answer."""
    try:
        if isinstance(prepared, EosError):
            raise prepared
        target = node.registry.get(batch.topic, batch.partition)
        if prepared is None:
            await node.access.require(caller, ResourceType.TOPIC, batch.topic, Operation.WRITE)
            prepared = target.validate_rows(batch, body_bytes=body_bytes)
        result = await append_batch(node, target, batch, prepared, caller)
    except EosError as exc:
        node.metrics.errors.labels(exc.code).inc()
        return _construct(
            topic=batch.topic, partition=batch.partition, base_offset=None,
            last_offset=None, duplicate=None, log_append_time_ms=None,
            error=ErrorBody.model_construct(**exc.envelope()["error"]),
        )  # fmt: skip
    return _construct(
        topic=batch.topic, partition=batch.partition, base_offset=result.base_offset,
        last_offset=result.last_offset, duplicate=result.duplicate,
        log_append_time_ms=result.append_time_ms, error=None,
    )  # fmt: skip


#: The answer's entries are made of values the node made itself: no validation needed.
_construct = PartitionProduced.model_construct
