"""Admin endpoints (KIP-664): list, describe and force-abort transactions.

Listing and describing read the database, so any instance answers for the whole cluster;
a force-abort changes state and therefore goes to the id's owner like every other write.
"""

from __future__ import annotations

from fastapi import APIRouter, Query

from coordinator_service.api.access import Caller
from coordinator_service.api.deps import ServicesDep, TransactionalIdPath
from coordinator_service.transactions.state import TxnRecord
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import Empty, TopicPartition
from eos_protocol.coordinator import (
    EndTransactionResponse,
    ListTransactionsResponse,
    TransactionDescription,
    TransactionListing,
)
from eos_protocol.errors import TransactionalIdNotFoundError
from eos_protocol.states import TransactionState
from eos_server.envelope import error_responses

router = APIRouter(tags=["admin"])


def _duration(rec: TxnRecord, now_ms: int) -> int | None:
    """How long the open transaction has run; None when none is open."""
    open_ = rec.state is TransactionState.ONGOING or rec.state.is_prepare
    if not open_ or rec.txn_start_ms is None:
        return None
    return max(0, now_ms - rec.txn_start_ms)


def describe(rec: TxnRecord) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=rec.transactional_id,
        producer_id=rec.producer_id,
        producer_epoch=rec.producer_epoch,
        state=rec.state,
        transaction_timeout_ms=rec.timeout_ms,
        txn_start_ms=rec.txn_start_ms,
        last_update_ms=rec.last_update_ms,
        partitions=[TopicPartition(topic=t, partition=p) for t, p in rec.partitions],
        groups=list(rec.groups),
        coordinator_epoch=rec.coordinator_epoch,
    )


@router.get(
    "/v1/transactions",
    operation_id="listTransactions",
    summary="List transactions (ListTransactions)",
    description=(
        "Every transactional id the cluster knows, optionally only those in `state` or "
        "whose open transaction has run at least `min_duration_ms` (hanging transactions). "
        "Lists only the ids the caller may describe."
    ),
    response_model=ListTransactionsResponse,
    responses=error_responses("UNAUTHENTICATED"),
)
async def list_transactions(
    services: ServicesDep,
    caller: Caller,
    state: TransactionState | None = Query(default=None),
    min_duration_ms: int | None = Query(default=None, ge=0),
) -> ListTransactionsResponse:
    now = services.clock.now_ms()
    records = await services.db.run(services.store.list_all, state)
    listings = []
    for rec in records:
        if not services.access.allowed(
            caller, ResourceType.TRANSACTIONAL_ID, rec.transactional_id, Operation.DESCRIBE
        ):
            continue
        duration = _duration(rec, now)
        if min_duration_ms is not None and (duration is None or duration < min_duration_ms):
            continue
        listings.append(
            TransactionListing(
                transactional_id=rec.transactional_id,
                producer_id=rec.producer_id,
                state=rec.state,
                duration_ms=duration,
            )
        )
    return ListTransactionsResponse(transactions=listings)


@router.get(
    "/v1/transactions/{tid}",
    operation_id="describeTransaction",
    summary="Describe one transactional id (DescribeTransactions)",
    response_model=TransactionDescription,
    responses=error_responses(
        "TRANSACTIONAL_ID_NOT_FOUND", "UNAUTHENTICATED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    ),
)
async def describe_transaction(
    tid: TransactionalIdPath, services: ServicesDep, caller: Caller
) -> TransactionDescription:
    await services.access.require(caller, ResourceType.TRANSACTIONAL_ID, tid, Operation.DESCRIBE)
    rec = await services.db.run(services.store.get, tid)
    if rec is None:
        raise TransactionalIdNotFoundError(f"unknown transactional id {tid!r}")
    return describe(rec)


@router.post(
    "/v1/admin/transactions/{tid}/abort",
    operation_id="forceAbortTransaction",
    summary="Force-abort a hanging transaction (KIP-664)",
    description=(
        "Aborts the id's open transaction and bumps its epoch, so the producer that "
        "started it is fenced. Needs alter on the cluster."
    ),
    response_model=EndTransactionResponse,
    responses=error_responses(
        "INVALID_REQUEST", "TRANSACTIONAL_ID_NOT_FOUND", "NOT_COORDINATOR",
        "COORDINATOR_NOT_AVAILABLE",
        "COORDINATOR_LOAD_IN_PROGRESS", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED",
    ),
)
async def force_abort(
    tid: TransactionalIdPath, _body: Empty, services: ServicesDep, caller: Caller
) -> EndTransactionResponse:
    await services.access.require_cluster(caller, Operation.ALTER)
    state = await services.coordinator.force_abort(tid)
    return EndTransactionResponse(transactional_id=tid, state=state)
