"""The transactional producer's lifecycle: init, add partitions, add offsets, commit, abort.

Only the owner of the transactional id's log partition answers; any other instance answers
NOT_COORDINATOR with the owner's URL (``details.coordinator_url``).
"""

from __future__ import annotations

from fastapi import APIRouter

from coordinator_service.api.deps import ServicesDep, TransactionalIdPath
from sdk.protocol.common import Empty
from sdk.protocol.coordinator import (
    AddOffsetsRequest,
    AddPartitionsRequest,
    AddPartitionsResponse,
    EndTransactionRequest,
    EndTransactionResponse,
    InitTransactionsRequest,
    ProducerIdResponse,
)
from sdk.protocol.server import error_responses

router = APIRouter(prefix="/v1/transactions", tags=["transactions"])

_ROUTING = ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
_PRODUCER = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING")


@router.post(
    "/{tid}/init",
    response_model=ProducerIdResponse,
    responses=error_responses(
        *_ROUTING, *_PRODUCER, "INVALID_TRANSACTION_TIMEOUT", "CONCURRENT_TRANSACTIONS",
        "INVALID_TXN_STATE",
    ),
)
async def init_transactions(
    tid: TransactionalIdPath, body: InitTransactionsRequest, services: ServicesDep
) -> ProducerIdResponse:
    producer_id, epoch = await services.coordinator.init(tid, body)
    return ProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)


@router.post(
    "/{tid}/partitions",
    response_model=AddPartitionsResponse,
    responses=error_responses(
        *_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE"
    ),
)
async def add_partitions(
    tid: TransactionalIdPath, body: AddPartitionsRequest, services: ServicesDep
) -> AddPartitionsResponse:
    results = await services.coordinator.add_partitions(tid, body)
    return AddPartitionsResponse(partitions=results)


@router.post(
    "/{tid}/offsets",
    response_model=Empty,
    responses=error_responses(
        *_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE"
    ),
)
async def add_offsets(
    tid: TransactionalIdPath, body: AddOffsetsRequest, services: ServicesDep
) -> Empty:
    await services.coordinator.add_offsets(tid, body)
    return Empty()


async def _end(
    tid: str, body: EndTransactionRequest, services: ServicesDep, *, commit: bool
) -> EndTransactionResponse:
    state = await services.coordinator.end(
        tid, body.producer_id, body.producer_epoch, commit=commit, wait=body.wait_for_markers
    )
    return EndTransactionResponse(transactional_id=tid, state=state)


_END_ERRORS = error_responses(*_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE")


@router.post("/{tid}/commit", response_model=EndTransactionResponse, responses=_END_ERRORS)
async def commit_transaction(
    tid: TransactionalIdPath, body: EndTransactionRequest, services: ServicesDep
) -> EndTransactionResponse:
    return await _end(tid, body, services, commit=True)


@router.post("/{tid}/abort", response_model=EndTransactionResponse, responses=_END_ERRORS)
async def abort_transaction(
    tid: TransactionalIdPath, body: EndTransactionRequest, services: ServicesDep
) -> EndTransactionResponse:
    return await _end(tid, body, services, commit=False)
