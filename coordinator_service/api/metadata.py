"""Metadata endpoints: cluster metadata, topics, FindCoordinator and idempotent producer ids.

These are answered by any instance: placement and lease owners are read from the database
(through the metadata cache), so a client may bootstrap from whichever coordinator it knows.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, status

from coordinator_service.api.access import Caller, may_create_topic
from coordinator_service.api.deps import ServicesDep
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, Empty
from eos_protocol.coordinator import (
    AlterTopicConfigRequest,
    CreateTopicRequest,
    DeleteTopicResponse,
    FindCoordinatorResponse,
    KeyType,
    MetadataResponse,
    ProducerIdResponse,
    TopicInfo,
)
from eos_protocol.errors import CoordinatorNotAvailableError
from eos_protocol.partitioning import group_offsets_partition
from eos_protocol.versions import CURRENT_FEATURES
from eos_server.envelope import error_responses

router = APIRouter(prefix="/v1", tags=["metadata"])


@router.get(
    "/metadata",
    operation_id="getMetadata",
    summary="Cluster metadata: storage nodes, topics, partition leaders and features",
    description="Lists only the topics the caller may describe. `features` names what "
    "this coordinator understands (release, request protocol, transaction versions), so a "
    "client of another release sends only requests it takes.",
    response_model=MetadataResponse,
    responses=error_responses("UNAUTHENTICATED"),
)
async def get_metadata(
    services: ServicesDep,
    caller: Caller,
    include_topics: bool = Query(
        default=True,
        description="false: only the cluster id, storage nodes and live coordinators "
        "(what a client asks to learn where it may fall over to).",
    ),
) -> MetadataResponse:
    md = services.metadata
    access = services.access
    topics = await md.all_topics() if include_topics else []
    return MetadataResponse(
        cluster_id=md.cluster_id,
        nodes=[md.node_info(n) for n in md.nodes],
        coordinators=await services.instances.live(),
        topics=[
            topic
            for topic in topics
            if access.allowed(caller, ResourceType.TOPIC, topic.name, Operation.DESCRIBE)
        ],
        features=CURRENT_FEATURES,
    )


@router.post(
    "/topics",
    operation_id="createTopic",
    summary="Create a topic",
    description="Places the partitions on the storage nodes (replication_factor replicas "
    "each, on distinct nodes) and answers with their leaders.",
    status_code=status.HTTP_201_CREATED,
    response_model=TopicInfo,
    responses=error_responses(
        "INVALID_REQUEST", "TOPIC_ALREADY_EXISTS", "UNAUTHENTICATED", "TOPIC_AUTHORIZATION_FAILED"
    ),
)
async def create_topic(
    body: CreateTopicRequest, services: ServicesDep, caller: Caller
) -> TopicInfo:
    await may_create_topic(services, caller, body.name)
    return await services.metadata.create_topic(
        body.name, body.partitions, replication_factor=body.replication_factor,
        min_insync_replicas=body.min_insync_replicas,
        unclean_leader_election=body.unclean_leader_election,
        retention_ms=body.retention_ms, retention_bytes=body.retention_bytes,
    )


@router.get(
    "/topics/{topic}",
    operation_id="describeTopic",
    summary="A topic's partitions and their leaders",
    response_model=TopicInfo,
    responses=error_responses(
        "UNKNOWN_TOPIC_OR_PARTITION", "UNAUTHENTICATED", "TOPIC_AUTHORIZATION_FAILED"
    ),
)
async def get_topic(topic: str, services: ServicesDep, caller: Caller) -> TopicInfo:
    await services.access.require(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    return await services.metadata.topic(topic)


@router.patch(
    "/topics/{topic}",
    operation_id="alterTopicConfig",
    summary="Change a topic's retention",
    description="Needs alter on the topic. The fields left out keep their values; the "
    "storage nodes apply the new retention within a heartbeat.",
    response_model=TopicInfo,
    responses=error_responses(
        "INVALID_REQUEST", "UNKNOWN_TOPIC_OR_PARTITION", "UNAUTHENTICATED",
        "TOPIC_AUTHORIZATION_FAILED",
    ),
)
async def alter_topic_config(
    topic: str, body: AlterTopicConfigRequest, services: ServicesDep, caller: Caller
) -> TopicInfo:
    await services.access.require(caller, ResourceType.TOPIC, topic, Operation.ALTER)
    return await services.metadata.alter_retention(
        topic, body.retention_ms, body.retention_bytes
    )


@router.delete(
    "/topics/{topic}",
    operation_id="deleteTopic",
    summary="Delete a topic",
    description="Needs delete on the topic. The topic leaves the metadata at once (every "
    "request about it answers UNKNOWN_TOPIC_OR_PARTITION from then on, and a transaction's "
    "markers for it are dropped); the storage nodes remove its replicas in the background, "
    "and the name can be created again once each has confirmed (TOPIC_ALREADY_EXISTS "
    "until then, naming the nodes still to confirm). Internal topics cannot be deleted.",
    response_model=DeleteTopicResponse,
    responses=error_responses(
        "INVALID_REQUEST", "UNKNOWN_TOPIC_OR_PARTITION", "UNAUTHENTICATED",
        "TOPIC_AUTHORIZATION_FAILED",
    ),
)
async def delete_topic(topic: str, services: ServicesDep, caller: Caller) -> DeleteTopicResponse:
    await services.access.require(caller, ResourceType.TOPIC, topic, Operation.DELETE)
    return await services.metadata.delete_topic(topic)


@router.get(
    "/coordinators",
    operation_id="findCoordinator",
    summary="Find the coordinator of a transactional id or a group (FindCoordinator)",
    response_model=FindCoordinatorResponse,
    responses=error_responses(
        "COORDINATOR_NOT_AVAILABLE", "UNAUTHENTICATED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
    ),
)
async def find_coordinator(
    services: ServicesDep,
    caller: Caller,
    key: str = Query(min_length=1, max_length=249),
    key_type: KeyType = Query(default=KeyType.TRANSACTION),
) -> FindCoordinatorResponse:
    """Transactions: the live owner of the id's log partition. Groups: the storage node
    leading the group's ``__consumer_offsets`` partition."""
    if key_type is KeyType.GROUP:
        await services.access.require(caller, ResourceType.GROUP, key, Operation.READ)
        md = services.metadata
        partition = group_offsets_partition(key, md.offsets_partitions)
        node = await md.leader(CONSUMER_OFFSETS_TOPIC, partition)
        if node is None:
            raise CoordinatorNotAvailableError("the group offsets topic has no placement yet")
        if node < 0:
            raise CoordinatorNotAvailableError(
                f"{CONSUMER_OFFSETS_TOPIC}/{partition} has no live leader now; retry"
            )
        info = md.node_info(node)
        return FindCoordinatorResponse(
            key=key, key_type=key_type, node_id=info.node_id, url=info.url
        )
    await services.access.require(
        caller, ResourceType.TRANSACTIONAL_ID, key, Operation.DESCRIBE
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
    description="Needs write on at least one topic (KIP-679).",
    response_model=ProducerIdResponse,
    responses=error_responses("INVALID_REQUEST", "UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED"),
)
async def new_producer(_body: Empty, services: ServicesDep, caller: Caller) -> ProducerIdResponse:
    """A producer id for an idempotent (non-transactional) producer."""
    await services.access.require_somewhere(caller, ResourceType.TOPIC, Operation.WRITE)
    return ProducerIdResponse(producer_id=await services.producer_ids.next_id(), producer_epoch=0)
