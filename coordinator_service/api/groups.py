"""Consumer group membership (KIP-848) and group administration.

The heartbeat is the whole membership protocol: join, heartbeat, leave. Only the group's
coordinator (the owner of the lease its id hashes to) answers it; any other instance
answers NOT_COORDINATOR with the owner's URL, as for transactional ids. Listing and
describing read the database and work on any instance; deleting a group needs its
coordinator, which alone may write it.

Rights, as in Kafka: a member needs read on the group and describe on each topic it
names; listing and describing need describe on the group; deleting needs alter on it;
a reset needs read on the group and on each topic (Kafka's AlterConsumerGroupOffsets).
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Path, Query, Request

from coordinator_service.api.access import Caller
from coordinator_service.api.deps import ServicesDep
from coordinator_service.groups import store
from coordinator_service.groups.fencing import check_member
from coordinator_service.groups.membership import Group
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import MAX_ID_LENGTH, Empty, TopicPartition
from eos_protocol.errors import (
    EosError,
    GroupIdNotFoundError,
    NonEmptyGroupError,
)
from eos_protocol.groups import (
    GroupDescription,
    GroupHeartbeatRequest,
    GroupHeartbeatResponse,
    GroupList,
    GroupListing,
    GroupMemberDescription,
    MemberOffsetCommitRequest,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
)
from eos_protocol.node import OffsetCommitResponse
from eos_server.envelope import error_responses

router = APIRouter(prefix="/v1/groups", tags=["groups"])

GroupIdPath = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="The consumer group id.")
]
_ROUTING = ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
_AUTH = ("UNAUTHENTICATED", "GROUP_AUTHORIZATION_FAILED")


def _tps(parts: frozenset[tuple[str, int]]) -> list[TopicPartition]:
    return [TopicPartition(topic=t, partition=p) for t, p in sorted(parts)]


def describe_group(group: Group) -> GroupDescription:
    members = [
        GroupMemberDescription(
            member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
            member_epoch=m.member_epoch, state=m.state.value,
            subscribed_topic_names=list(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex, assignment=_tps(m.assigned),
            partitions_pending_revocation=_tps(m.pending_revocation),
            target_assignment=_tps(m.target), client_host=m.client_host,
        )
        for m in sorted(group.members.values(), key=lambda m: m.member_id)
    ]
    return GroupDescription(
        group_id=group.group_id, state=group.state,
        group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
        members=members,
    )


@router.post(
    "/{group_id}/heartbeat",
    operation_id="consumerGroupHeartbeat",
    summary="Join, heartbeat in or leave a consumer group (ConsumerGroupHeartbeat, KIP-848)",
    description=(
        "Join with `member_epoch` 0 and a subscription; then heartbeat every "
        "`heartbeat_interval_ms` with the `member_id` and `member_epoch` of the last answer "
        "and the partitions you read in `owned_partitions`; leave with -1. The answer's "
        "`assignment` is everything you may read: let go of (commit, then stop reading) "
        "any partition it no longer lists and say so in `owned_partitions`. "
        "`FENCED_MEMBER_EPOCH` or `UNKNOWN_MEMBER_ID`: stop reading everything and join "
        "again."
    ),
    response_model=GroupHeartbeatResponse,
    responses=error_responses(
        "INVALID_REQUEST", *_AUTH, *_ROUTING, "TOPIC_AUTHORIZATION_FAILED",
        "UNKNOWN_TOPIC_OR_PARTITION", "INVALID_REGULAR_EXPRESSION", "FENCED_MEMBER_EPOCH",
        "UNKNOWN_MEMBER_ID", "UNRELEASED_INSTANCE_ID", "GROUP_MAX_SIZE_REACHED",
    ),
)
async def heartbeat(
    group_id: GroupIdPath,
    body: GroupHeartbeatRequest,
    services: ServicesDep,
    caller: Caller,
    request: Request,
) -> GroupHeartbeatResponse:
    await services.access.require(caller, ResourceType.GROUP, group_id, Operation.READ)
    for topic in sorted(set(body.subscribed_topic_names or ())):
        await services.access.require(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    host = request.client.host if request.client is not None else None
    return await services.groups.heartbeat(group_id, body, host)


@router.get(
    "",
    operation_id="listGroups",
    summary="Every consumer group on record (ListGroups)",
    response_model=GroupList,
    responses=error_responses("UNAUTHENTICATED"),
)
async def list_groups(services: ServicesDep, caller: Caller) -> GroupList:
    rows = await services.db.run(store.list_groups)
    listed = []
    for group_id, group_epoch, assignment_epoch, count in rows:
        if not services.access.allowed(caller, ResourceType.GROUP, group_id, Operation.DESCRIBE):
            continue
        state = "empty" if not count else (
            "assigning" if assignment_epoch < group_epoch else "stable"
        )
        cached = services.groups.cached(group_id)
        if cached is not None:
            state = cached.state
        listed.append(GroupListing(group_id=group_id, state=state,
                                   members=count, group_epoch=group_epoch))
    return GroupList(groups=listed)


@router.get(
    "/{group_id}",
    operation_id="describeGroup",
    summary="A consumer group's members, epochs and assignments (DescribeGroups)",
    response_model=GroupDescription,
    responses=error_responses(*_AUTH, "GROUP_ID_NOT_FOUND"),
)
async def describe(
    group_id: GroupIdPath,
    services: ServicesDep,
    caller: Caller,
    request: Request,
    lag: Annotated[bool, Query(description="Add each partition's lag (asks the nodes).")] = True,
) -> GroupDescription:
    await services.access.require(caller, ResourceType.GROUP, group_id, Operation.DESCRIBE)
    group = services.groups.cached(group_id) or await services.db.run(store.load_group, group_id)
    if group is None:
        raise GroupIdNotFoundError(f"no consumer group {group_id!r} is on record")
    described = describe_group(group)
    if lag:
        owners = {tp: m.member_id for m in group.members.values() for tp in m.assigned}
        parts = [(t, p) for t, n in group.subscribed_metadata.items() for p in range(n)]
        try:
            described.lag = await services.group_offsets.lag(
                group_id, parts, owners, _caller_headers(request)
            )
        except (EosError, httpx.HTTPError) as exc:
            described.lag_error = str(exc)
    return described


def _caller_headers(request: Request) -> dict[str, str]:
    """The caller's credentials, for the nodes to judge its rights as their own."""
    auth = request.headers.get("authorization")
    return {"authorization": auth} if auth else {}


@router.post(
    "/{group_id}/offsets/reset",
    operation_id="resetGroupOffsets",
    summary="Move an empty group's committed offsets (earliest, latest, a time, an offset)",
    description="Refused with NON_EMPTY_GROUP while the group has members; only the "
    "group's coordinator answers. `to_latest` is the last stable offset; `to_timestamp_ms` "
    "the first committed record at or after that time; `to_offset` is clamped to what "
    "the partition holds. Every partition of each topic is moved.",
    response_model=ResetOffsetsResponse,
    responses=error_responses(
        "INVALID_REQUEST", *_AUTH, *_ROUTING, "NON_EMPTY_GROUP", "UNKNOWN_TOPIC_OR_PARTITION",
        "TOPIC_AUTHORIZATION_FAILED",
    ),
)
async def reset_offsets(
    group_id: GroupIdPath,
    body: ResetOffsetsRequest,
    services: ServicesDep,
    caller: Caller,
    request: Request,
) -> ResetOffsetsResponse:
    await services.access.require(caller, ResourceType.GROUP, group_id, Operation.READ)
    for name in sorted(set(body.topics)):
        await services.access.require(caller, ResourceType.TOPIC, name, Operation.READ)
    async with services.groups.locked(group_id):
        _, group = await services.groups.owned(group_id)
        if group.members:
            raise NonEmptyGroupError(
                f"group {group_id!r} has {len(group.members)} members; stop them first"
            )
        offsets = await services.group_offsets.reset(group_id, body, _caller_headers(request))
    return ResetOffsetsResponse(offsets=offsets)


@router.delete(
    "/{group_id}",
    operation_id="deleteGroup",
    summary="Delete an empty consumer group's state (DeleteGroups)",
    description="Refused with NON_EMPTY_GROUP while the group has members. Committed "
    "offsets stay on the storage nodes (reset them with the offsets calls).",
    response_model=Empty,
    responses=error_responses(*_AUTH, *_ROUTING, "GROUP_ID_NOT_FOUND", "NON_EMPTY_GROUP"),
)
async def delete(group_id: GroupIdPath, services: ServicesDep, caller: Caller) -> Empty:
    await services.access.require(caller, ResourceType.GROUP, group_id, Operation.ALTER)
    groups = services.groups
    async with groups.locked(group_id):
        token, group = await groups.owned(group_id)
        if group.members:
            raise NonEmptyGroupError(
                f"group {group_id!r} has {len(group.members)} members; it can be deleted "
                "once they have left or timed out"
            )
        existed = group.group_epoch > 0
        await groups.delete(group_id, token)
    if not existed:
        raise GroupIdNotFoundError(f"no consumer group {group_id!r} is on record")
    return Empty()


@router.post(
    "/{group_id}/offsets",
    operation_id="commitMemberOffsets",
    summary="Commit a member's offsets, fenced by its membership (OffsetCommit)",
    description=(
        "For members of a group with subscriptions: the coordinator checks that the member "
        "is current and owns every partition named (`UNKNOWN_MEMBER_ID`, "
        "`FENCED_MEMBER_EPOCH` otherwise) and writes the offsets to the group's offsets "
        "node while no rebalance can move them. Consumers that `assign()` partitions "
        "commit at the node directly (`commitGroupOffsets`)."
    ),
    response_model=OffsetCommitResponse,
    responses=error_responses(
        "INVALID_REQUEST", *_AUTH, *_ROUTING, "TOPIC_AUTHORIZATION_FAILED",
        "UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH",
    ),
)
async def commit_member_offsets(
    group_id: GroupIdPath,
    body: MemberOffsetCommitRequest,
    services: ServicesDep,
    caller: Caller,
    request: Request,
) -> Any:
    await services.access.require(caller, ResourceType.GROUP, group_id, Operation.READ)
    for name in sorted({o.topic for o in body.offsets}):
        await services.access.require(caller, ResourceType.TOPIC, name, Operation.READ)
    partitions = frozenset((o.topic, o.partition) for o in body.offsets)
    async with services.groups.locked(group_id):  # no member is removed meanwhile
        _, group = await services.groups.owned(group_id)
        member = group.members.get(body.member_id)
        check_member(group_id, body.member_id, body.member_epoch, partitions, member,
                     len(group.members))
        return await services.group_offsets.commit(
            group_id, [o.model_dump() for o in body.offsets], _caller_headers(request)
        )
