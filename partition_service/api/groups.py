"""Consumer-group offsets: plain commits, transactional commits (TxnOffsetCommit), reads.

Offsets are records of the group's ``__consumer_offsets`` partition on this node; a
transactional commit is a transactional batch there, so it becomes visible with the same
COMMIT marker as the transaction's data.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, MAX_ID_LENGTH, TopicPartition
from eos_protocol.errors import UnstableOffsetCommitError
from eos_protocol.node import (
    GroupOffsetsResponse,
    OffsetCommitEntry,
    OffsetCommitRequest,
    OffsetCommitResponse,
    RecordIn,
    TxnOffsetCommitRequest,
)
from eos_security.access import Caller
from eos_server.envelope import error_responses
from partition_service.api.records import json_response
from partition_service.context import Node, NodeContext
from partition_service.log.group_offsets import encode_offset_record

router = APIRouter(prefix="/v1/groups/{group_id}", tags=["groups"])

_AUTH = ("UNAUTHENTICATED", "GROUP_AUTHORIZATION_FAILED")
GroupPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="Group id.")]


def _records(group_id: str, offsets: list[OffsetCommitEntry]) -> list[RecordIn]:
    records = []
    for entry in offsets:
        key, value = encode_offset_record(
            group_id, entry.topic, entry.partition, entry.offset, entry.metadata
        )
        records.append(RecordIn(key=key, value=value))
    return records


async def _may_use_group(
    node: NodeContext, caller: str | None, group_id: str, offsets: list[OffsetCommitEntry]
) -> None:
    """Kafka's OffsetCommit rights: read on the group and on every topic named."""
    await node.access.require(caller, ResourceType.GROUP, group_id, Operation.READ)
    for topic in sorted({entry.topic for entry in offsets}):
        await node.access.require(caller, ResourceType.TOPIC, topic, Operation.READ)


def _echo(offsets: list[OffsetCommitEntry]) -> Response:
    return json_response({"offsets": [entry.model_dump() for entry in offsets]})


@router.post(
    "/offsets",
    operation_id="commitGroupOffsets",
    summary="Commit a group's offsets (outside any transaction)",
    response_model=OffsetCommitResponse,
    responses=error_responses(
        "INVALID_REQUEST", "NOT_COORDINATOR", "KAFKA_STORAGE_ERROR", "MESSAGE_TOO_LARGE",
        "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_OR_FOLLOWER",
        *_AUTH, "TOPIC_AUTHORIZATION_FAILED",
    ),
)
async def commit_offsets(
    group_id: GroupPath, body: OffsetCommitRequest, node: Node, caller: Caller
) -> Response:
    await _may_use_group(node, caller, group_id, body.offsets)
    target = node.registry.group_coordinator(group_id)
    target.role.require_leader(acks_all=True)  # offsets are acks=all writes, as in Kafka
    result = target.append_rows(target.rows(_records(group_id, body.offsets)))
    await target.wait_durable(result)
    return _echo(body.offsets)


@router.post(
    "/txn-offsets",
    operation_id="commitTransactionalOffsets",
    summary="Add offsets to a transaction (TxnOffsetCommit): pending until its marker",
    response_model=OffsetCommitResponse,
    responses=error_responses(
        "INVALID_REQUEST",
        "NOT_COORDINATOR",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "TRANSACTION_ABORTABLE",
        "COORDINATOR_NOT_AVAILABLE",
        "CONCURRENT_TRANSACTIONS",
        "KAFKA_STORAGE_ERROR",
        "MESSAGE_TOO_LARGE",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "NOT_LEADER_OR_FOLLOWER",
        *_AUTH,
        "TOPIC_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    ),
)
async def commit_txn_offsets(
    group_id: GroupPath, body: TxnOffsetCommitRequest, node: Node, caller: Caller
) -> Response:
    await node.access.require(
        caller, ResourceType.TRANSACTIONAL_ID, body.transactional_id, Operation.WRITE
    )
    await _may_use_group(node, caller, group_id, body.offsets)
    target = node.registry.group_coordinator(group_id)
    if target.needs_verification(body.producer_id, body.producer_epoch):
        with target.verifications.guard(body.producer_id) as guard:
            verified = await node.verifier.verify(
                body.producer_id,
                body.producer_epoch,
                TopicPartition(topic=CONSUMER_OFFSETS_TOPIC, partition=target.index),
            )
            target.verifications.check(guard, body.producer_id, verified.transaction_version)
    # checked again after the verification's round trip, in the append's step
    target.role.require_leader(acks_all=True)
    result = target.append_rows(
        target.rows(_records(group_id, body.offsets)),
        producer_id=body.producer_id,
        producer_epoch=body.producer_epoch,
        transactional=True,
    )
    await target.wait_durable(result)
    return _echo(body.offsets)


@router.get(
    "/offsets",
    operation_id="fetchGroupOffsets",
    summary="A group's committed offsets",
    response_model=GroupOffsetsResponse,
    description="Needs read on the group; lists only the topics the caller may describe.",
    responses=error_responses("NOT_COORDINATOR", "UNSTABLE_OFFSET_COMMIT", *_AUTH),
)
async def fetch_offsets(
    group_id: GroupPath,
    node: Node,
    caller: Caller,
    require_stable: Annotated[
        bool, Query(description="Refuse with UNSTABLE_OFFSET_COMMIT while offsets are pending.")
    ] = True,
) -> Response:
    await node.access.require(caller, ResourceType.GROUP, group_id, Operation.READ)
    target = node.registry.group_coordinator(group_id)
    view = target.engine.groups
    assert view is not None
    if require_stable and view.has_pending(group_id):
        raise UnstableOffsetCommitError(
            f"a transaction holds pending offsets for group {group_id!r}"
        )
    offsets = [
        {"topic": topic, "partition": partition, "offset": offset, "metadata": metadata}
        for (topic, partition), (offset, metadata) in sorted(view.offsets(group_id).items())
        if node.access.allowed(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    ]
    return json_response({"offsets": offsets})
