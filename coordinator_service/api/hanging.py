"""Admin endpoints of the hanging-transaction detector (KIP-664's find-hanging and abort).

``GET /v1/admin/hanging-transactions`` runs a fresh pass of the detector (it only reads:
every node's open transactions, then the records holding their producer ids), so any
instance answers for the whole cluster and a console sees the state of the moment, not
of the last background pass. ``POST /v1/admin/hanging-transactions/abort`` writes one
abort marker, with the bumped epoch, on the partition's leader; it refuses, changing
nothing, whatever the rule would not abort (``coordinator_service/hanging/rule.py``).
"""

from __future__ import annotations

from fastapi import APIRouter

from coordinator_service.api.access import Caller
from coordinator_service.api.deps import ServicesDep
from eos_protocol.acl import Operation
from eos_protocol.hanging import (
    AbortHangingRequest,
    AbortHangingResponse,
    HangingTransactionsResponse,
)
from eos_server.envelope import error_responses

router = APIRouter(tags=["admin"])


@router.get(
    "/v1/admin/hanging-transactions",
    operation_id="listHangingTransactions",
    summary="Hanging transactions on the storage nodes (KIP-664 find-hanging)",
    description=(
        "Asks every storage node for the transactions open on the partitions it leads and "
        "lists those the coordinators cannot end, with the reason. A node that does not "
        "answer is left out (and logged). Needs describe on the cluster."
    ),
    response_model=HangingTransactionsResponse,
    responses=error_responses("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def list_hanging(services: ServicesDep, caller: Caller) -> HangingTransactionsResponse:
    await services.access.require_cluster(caller, Operation.DESCRIBE)
    found = await services.hanging.detect()
    return found.report()


@router.post(
    "/v1/admin/hanging-transactions/abort",
    operation_id="abortHangingTransaction",
    summary="Abort one hanging transaction on one partition (KIP-664 abort)",
    description=(
        "Writes an ABORT marker with the open epoch + 1 on the partition's leader, which "
        "fences later batches of the old epoch there. Refused with INVALID_TXN_STATE when "
        "the batches are committed data whose marker was lost (the detector sends the "
        "COMMIT marker again) or when the coordinator holds the transaction as ongoing "
        "(abort it through its transactional id); NOT_FOUND when no such transaction is "
        "open there. Needs alter on the cluster."
    ),
    response_model=AbortHangingResponse,
    responses=error_responses(
        "INVALID_REQUEST", "UNKNOWN_TOPIC_OR_PARTITION", "NOT_FOUND", "INVALID_TXN_STATE",
        "LEADER_NOT_AVAILABLE", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED",
    ),
)
async def abort_hanging(
    body: AbortHangingRequest, services: ServicesDep, caller: Caller
) -> AbortHangingResponse:
    await services.access.require_cluster(caller, Operation.ALTER)
    return await services.hanging.abort_requested(body)
