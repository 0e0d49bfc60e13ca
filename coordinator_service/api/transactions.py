"""The transactional producer's lifecycle: init, add partitions, add offsets, commit, abort.

Only the owner of the transactional id's log partition answers; any other instance answers
NOT_COORDINATOR with the owner's URL (``details.coordinator_url``).

Add partitions, commit and abort come with every transaction: ``FAST_PATHS`` answers them
without FastAPI's per-request work (``eos_server/fastpath.py``), by calling the same
endpoints with the same arguments, so the routes stay the one statement of what they do.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.datastructures import State

from coordinator_service.api.access import (
    Caller,
    may_add_partitions,
    may_write_transaction,
)
from coordinator_service.api.deps import ServicesDep, TransactionalIdPath
from coordinator_service.services import Services
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import Empty
from eos_protocol.coordinator import (
    TRANSACTION_VERSION_1,
    AddOffsetsRequest,
    AddPartitionsRequest,
    AddPartitionsResponse,
    EndTransactionRequest,
    EndTransactionResponse,
    InitTransactionsRequest,
    ProducerIdResponse,
)
from eos_security.access import principal_of
from eos_server.envelope import error_responses
from eos_server.fastpath import FastCall, fast_path

router = APIRouter(prefix="/v1/transactions", tags=["transactions"])

_ROUTING = ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
_PRODUCER = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING")
_BODY = ("INVALID_REQUEST",)  # a body that is not JSON at all
_AUTH = ("UNAUTHENTICATED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")


@router.post(
    "/{tid}/init",
    operation_id="initTransactions",
    summary="Register a transactional producer (InitProducerId)",
    description=(
        "Gives the transactional id a producer id and a new epoch, fencing any older "
        "producer with the same id. An Ongoing transaction of the old producer is aborted; "
        "one still in Prepare* answers CONCURRENT_TRANSACTIONS until it completes. Sending "
        "the current `producer_id`/`producer_epoch` after a fatal idempotence error bumps "
        "the epoch and keeps the id (KIP-360). `transaction_version: 2` opts into KIP-890 "
        "part 2: the storage nodes add partitions on the first batch (no add-partitions "
        "calls) and every commit or abort bumps the epoch."
    ),
    response_model=ProducerIdResponse,
    responses=error_responses(
        *_BODY, *_AUTH, *_ROUTING, *_PRODUCER, "INVALID_TRANSACTION_TIMEOUT",
        "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE",
    ),
)
async def init_transactions(
    tid: TransactionalIdPath, body: InitTransactionsRequest, services: ServicesDep, caller: Caller
) -> ProducerIdResponse:
    await may_write_transaction(services, caller, tid)
    producer_id, epoch = await services.coordinator.init(tid, body)
    return ProducerIdResponse(
        producer_id=producer_id, producer_epoch=epoch,
        transaction_version=(
            body.transaction_version if body.transaction_version != TRANSACTION_VERSION_1
            else None
        ),
    )


@router.post(
    "/{tid}/partitions",
    operation_id="addPartitionsToTxn",
    summary="Add partitions to the open transaction (AddPartitionsToTxn)",
    description=(
        "Must precede the first transactional produce to each partition; the storage node "
        "verifies it (KIP-890). Starts the transaction when none is open. Each partition "
        "answers on its own (`error` is null when added)."
    ),
    response_model=AddPartitionsResponse,
    responses=error_responses(
        *_BODY, *_AUTH, *_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE",
        "TOPIC_AUTHORIZATION_FAILED",
    ),
)
async def add_partitions(
    tid: TransactionalIdPath, body: AddPartitionsRequest, services: ServicesDep, caller: Caller
) -> AddPartitionsResponse:
    await may_add_partitions(services, caller, tid, body.partitions)
    results = await services.coordinator.add_partitions(tid, body)
    return AddPartitionsResponse(partitions=results)


@router.post(
    "/{tid}/offsets",
    operation_id="addOffsetsToTxn",
    summary="Add a consumer group's offsets to the transaction (AddOffsetsToTxn)",
    description=(
        "Afterwards send the offsets themselves to the group's coordinator node "
        "(`commitTransactionalOffsets`); they become visible with the transaction's "
        "COMMIT marker."
    ),
    response_model=Empty,
    responses=error_responses(
        *_BODY, *_AUTH, *_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE",
        "GROUP_AUTHORIZATION_FAILED",
    ),
)
async def add_offsets(
    tid: TransactionalIdPath, body: AddOffsetsRequest, services: ServicesDep, caller: Caller
) -> Empty:
    await may_write_transaction(services, caller, tid)
    await services.access.require(caller, ResourceType.GROUP, body.group_id, Operation.READ)
    await services.coordinator.add_offsets(tid, body)
    return Empty()


async def _end(
    tid: str, body: EndTransactionRequest, services: ServicesDep, caller: str | None, *,
    commit: bool,
) -> EndTransactionResponse:
    await may_write_transaction(services, caller, tid)
    result = await services.coordinator.end(
        tid, body.producer_id, body.producer_epoch, commit=commit, wait=body.wait_for_markers
    )
    if not result.bumped:
        return EndTransactionResponse(transactional_id=tid, state=result.state)
    return EndTransactionResponse(
        transactional_id=tid, state=result.state, producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )


_END_ERRORS = error_responses(
    *_BODY, *_AUTH, *_ROUTING, *_PRODUCER, "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE"
)


@router.post(
    "/{tid}/commit",
    operation_id="commitTransaction",
    summary="Commit the open transaction (EndTxn COMMIT)",
    description=(
        "Answers once the decision (PrepareCommit) is durable; the markers follow "
        "asynchronously and are retried until every partition has them. With "
        "`wait_for_markers: true` the answer waits for CompleteCommit. Under transaction "
        "version 2 the epoch is bumped with the decision: the answer's "
        "`producer_id`/`producer_epoch` are the next transaction's, and the same request "
        "repeated (its answer lost) gets the same answer."
    ),
    response_model=EndTransactionResponse,
    responses=_END_ERRORS,
)
async def commit_transaction(
    tid: TransactionalIdPath, body: EndTransactionRequest, services: ServicesDep, caller: Caller
) -> EndTransactionResponse:
    return await _end(tid, body, services, caller, commit=True)


@router.post(
    "/{tid}/abort",
    operation_id="abortTransaction",
    summary="Abort the open transaction (EndTxn ABORT)",
    description=(
        "Answers once PrepareAbort is durable; read_committed readers never see the "
        "transaction's records. With `wait_for_markers: true` the answer waits for "
        "CompleteAbort. Bumps the epoch under transaction version 2, as commit does."
    ),
    response_model=EndTransactionResponse,
    responses=_END_ERRORS,
)
async def abort_transaction(
    tid: TransactionalIdPath, body: EndTransactionRequest, services: ServicesDep, caller: Caller
) -> EndTransactionResponse:
    return await _end(tid, body, services, caller, commit=False)


# --- fast paths: the same endpoints, their arguments read without FastAPI ---------------


def _services(state: State) -> Services:
    services: Services = state.services
    return services


@fast_path(add_partitions, AddPartitionsRequest)
async def add_partitions_fast(call: FastCall[AddPartitionsRequest]) -> AddPartitionsResponse:
    return await add_partitions(
        call.text("tid"), call.body(), _services(call.state), principal_of(call.scope)
    )


@fast_path(commit_transaction, EndTransactionRequest)
async def commit_fast(call: FastCall[EndTransactionRequest]) -> EndTransactionResponse:
    return await commit_transaction(
        call.text("tid"), call.body(), _services(call.state), principal_of(call.scope)
    )


@fast_path(abort_transaction, EndTransactionRequest)
async def abort_fast(call: FastCall[EndTransactionRequest]) -> EndTransactionResponse:
    return await abort_transaction(
        call.text("tid"), call.body(), _services(call.state), principal_of(call.scope)
    )


FAST_PATHS = (add_partitions_fast, commit_fast, abort_fast)
