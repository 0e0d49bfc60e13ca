"""Internal endpoints, for storage nodes only (internal token required).

``GET /internal/v1/acls`` hands the nodes the rules they enforce on produce and fetch.

``GET /internal/v1/coordinators`` names the live instances, so a node configured with
one or two coordinators learns the rest and falls over to them.

``GET /internal/v1/producers/{producer_id}/transaction`` is KIP-890's verification: before a
node opens a transaction for a producer on a partition it asks whether that partition was
added. Every add-partitions is durable before it is acknowledged, so any instance can answer
straight from the database, with no routing to the owner.

``POST /internal/v1/producers/{producer_id}/partitions`` is KIP-890 part 2 (transaction
version 2): the node adds the partition to the producer's transaction itself, instead of
the client's add-partitions. That is a write, so only the owner of the producer's
transaction-log partition makes it; any other instance answers NOT_COORDINATOR with the
owner's URL, which the node's pool follows. For a version-1 producer it changes nothing
and answers the record, which the node verifies as it does the GET's.

The owner of the producer's transaction-log partition answers from memory instead: its
cached records are exactly the rows (cached only after they are durable, and nobody else
may write them while its lease holds). It does so only while its lease is certainly live
by its own lease clock; otherwise, and for producers it does not cache, it reads the
database as any other instance would. Every transaction's first batch to a partition
asks it (or, under version 2, adds), so ``FAST_PATHS`` answers both without FastAPI's
per-request work.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Path

from coordinator_service.api.deps import ServicesDep
from coordinator_service.services import Services
from coordinator_service.transactions.state import TxnRecord
from eos_protocol.acl import AclSnapshot
from eos_protocol.common import TopicPartition
from eos_protocol.coordinator import (
    AddProducerPartitionRequest,
    LiveCoordinators,
    ProducerTransactionView,
)
from eos_protocol.errors import UnknownProducerIdError
from eos_server.envelope import error_responses
from eos_server.fastpath import FastCall, fast_path
from eos_server.internal import internal_token_checker


async def producer_transaction(
    services: ServicesDep, producer_id: int = Path(ge=0, le=2**63 - 1)
) -> ProducerTransactionView:
    rec = await services.coordinator.producer_record(producer_id)
    if rec is None:
        raise UnknownProducerIdError(f"no transactional id has producer id {producer_id}")
    return _view(rec)


def _view(rec: TxnRecord) -> ProducerTransactionView:
    return ProducerTransactionView(
        producer_id=rec.producer_id,
        producer_epoch=rec.producer_epoch,
        transactional_id=rec.transactional_id,
        state=rec.state,
        partitions=[TopicPartition(topic=t, partition=p) for t, p in rec.partitions],
        transaction_version=rec.transaction_version,
    )


async def add_producer_partition(
    body: AddProducerPartitionRequest,
    services: ServicesDep,
    producer_id: int = Path(ge=0, le=2**63 - 1),
) -> ProducerTransactionView:
    rec = await services.coordinator.add_for_producer(
        producer_id, body.producer_epoch, (body.topic, body.partition)
    )
    return _view(rec)


@fast_path(producer_transaction)
async def producer_transaction_fast(call: FastCall[None]) -> ProducerTransactionView:
    """The verification GET without FastAPI's per-request work (``eos_server/fastpath.py``);
    the router's internal-token check runs on it as on the route."""
    services: Services = call.state.services
    return await producer_transaction(services, call.number("producer_id"))


@fast_path(add_producer_partition, AddProducerPartitionRequest)
async def add_producer_partition_fast(
    call: FastCall[AddProducerPartitionRequest],
) -> ProducerTransactionView:
    services: Services = call.state.services
    return await add_producer_partition(call.body(), services, call.number("producer_id"))


FAST_PATHS = (producer_transaction_fast, add_producer_partition_fast)


def build_router(internal_token: str | None) -> APIRouter:
    router = APIRouter(
        prefix="/internal/v1",
        tags=["internal"],
        dependencies=[Depends(internal_token_checker(internal_token))],
    )

    router.get(
        "/producers/{producer_id}/transaction",
        operation_id="getProducerTransaction",
        summary="A producer's current transaction (KIP-890 verification; nodes only)",
        response_model=ProducerTransactionView,
        responses=error_responses(
            "UNKNOWN_PRODUCER_ID", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"
        ),
    )(producer_transaction)

    router.post(
        "/producers/{producer_id}/partitions",
        operation_id="addProducerPartition",
        summary="Add a partition to a producer's transaction (KIP-890 part 2; nodes only)",
        description=(
            "A storage node calls it before it appends a transactional batch that would "
            "open a transaction on the partition, for a producer of transaction version 2. "
            "Starts the transaction when none is open; durable before the answer. Only the "
            "owner of the producer's transaction-log partition writes: any other instance "
            "answers NOT_COORDINATOR with the owner's URL. A version-1 producer's record is "
            "answered unchanged (the node verifies it)."
        ),
        response_model=ProducerTransactionView,
        responses=error_responses(
            "INVALID_REQUEST", "UNKNOWN_PRODUCER_ID", "UNKNOWN_TOPIC_OR_PARTITION",
            "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING",
            "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE", "NOT_COORDINATOR",
            "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "UNAUTHENTICATED",
            "CLUSTER_AUTHORIZATION_FAILED",
        ),
    )(add_producer_partition)

    @router.get(
        "/acls",
        operation_id="getAclSnapshot",
        summary="Every ACL binding and the super users (storage nodes cache them)",
        response_model=AclSnapshot,
        responses=error_responses(
            "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "COORDINATOR_NOT_AVAILABLE"
        ),
    )
    async def acl_snapshot(services: ServicesDep) -> AclSnapshot:
        """Read from the database, not this instance's copy: a node stamps what it gets
        with the time it asked, so the answer must hold every grant made before then,
        whichever instance made it."""
        return await services.acl_rules.fresh_snapshot()

    @router.get(
        "/coordinators",
        operation_id="getLiveCoordinators",
        summary="The live coordinator instances (storage nodes fall over to them)",
        response_model=LiveCoordinators,
        responses=error_responses(
            "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED", "COORDINATOR_NOT_AVAILABLE"
        ),
    )
    async def live_coordinators(services: ServicesDep) -> LiveCoordinators:
        return LiveCoordinators(coordinators=await services.instances.live())

    return router


def install(app: FastAPI, internal_token: str | None) -> None:
    app.include_router(build_router(internal_token))
