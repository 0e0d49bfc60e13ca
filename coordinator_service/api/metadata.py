"""Metadata endpoints: cluster metadata, topics, FindCoordinator and idempotent producer ids.

These are answered by any instance: placement and lease owners are read from the database
(through the metadata cache), so a client may bootstrap from whichever coordinator it knows.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, status

from coordinator_service.api.deps import ServicesDep
from coordinator_service.transactions.state import group_offsets_partition
from sdk.protocol.common import CONSUMER_OFFSETS_TOPIC, Empty
from sdk.protocol.coordinator import (
    CreateTopicRequest,
    FindCoordinatorResponse,
    KeyType,
    MetadataResponse,
    ProducerIdResponse,
    TopicInfo,
)
from sdk.protocol.errors import CoordinatorNotAvailableError
from sdk.protocol.server import error_responses

router = APIRouter(prefix="/v1", tags=["metadata"])


@router.get(
    "/metadata",
    operation_id="getMetadata",
    summary="Cluster metadata: storage nodes, topics and partition leaders",
    response_model=MetadataResponse,
    responses=error_responses(),
)
async def get_metadata(services: ServicesDep) -> MetadataResponse:
    md = services.metadata
    return MetadataResponse(
        cluster_id=md.cluster_id,
        nodes=[md.node_info(n) for n in md.nodes],
        topics=await md.all_topics(),
    )


@router.post(
    "/topics",
    operation_id="createTopic",
    summary="Create a topic",
    description="Places the partitions on the storage nodes and answers with their leaders.",
    status_code=status.HTTP_201_CREATED,
    response_model=TopicInfo,
    responses=error_responses("INVALID_REQUEST", "TOPIC_ALREADY_EXISTS"),
)
async def create_topic(body: CreateTopicRequest, services: ServicesDep) -> TopicInfo:
    return await services.metadata.create_topic(body.name, body.partitions)


@router.get(
    "/topics/{topic}",
    operation_id="describeTopic",
    summary="A topic's partitions and their leaders",
    response_model=TopicInfo,
    responses=error_responses("UNKNOWN_TOPIC_OR_PARTITION"),
)
async def get_topic(topic: str, services: ServicesDep) -> TopicInfo:
    return await services.metadata.topic(topic)


@router.get(
    "/coordinators",
    operation_id="findCoordinator",
    summary="Find the coordinator of a transactional id or a group (FindCoordinator)",
    response_model=FindCoordinatorResponse,
    responses=error_responses("COORDINATOR_NOT_AVAILABLE"),
)
async def find_coordinator(
    services: ServicesDep,
    key: str = Query(min_length=1, max_length=249),
    key_type: KeyType = Query(default=KeyType.TRANSACTION),
) -> FindCoordinatorResponse:
    """Transactions: the live owner of the id's log partition. Groups: the storage node
    leading the group's ``__consumer_offsets`` partition."""
    if key_type is KeyType.GROUP:
        md = services.metadata
        partition = group_offsets_partition(key, md.offsets_partitions)
        node = await md.leader(CONSUMER_OFFSETS_TOPIC, partition)
        if node is None:
            raise CoordinatorNotAvailableError("the group offsets topic has no placement yet")
        info = md.node_info(node)
        return FindCoordinatorResponse(
            key=key, key_type=key_type, node_id=info.node_id, url=info.url
        )
    owner = await services.leases.owner(services.coordinator.partition_of(key))
    if not owner.alive or owner.url is None or owner.node_id is None:
        raise CoordinatorNotAvailableError(f"no live coordinator owns {key!r} right now")
    return FindCoordinatorResponse(
        key=key, key_type=key_type, node_id=owner.node_id, url=owner.url
    )


@router.post(
    "/producers",
    operation_id="allocateProducerId",
    summary="A producer id for an idempotent producer (no transactional id)",
    response_model=ProducerIdResponse,
    responses=error_responses("INVALID_REQUEST"),
)
async def new_producer(_body: Empty, services: ServicesDep) -> ProducerIdResponse:
    """A producer id for an idempotent (non-transactional) producer."""
    return ProducerIdResponse(producer_id=await services.producer_ids.next_id(), producer_epoch=0)
