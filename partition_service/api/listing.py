"""Every partition this node holds, with its offsets, in one request (``GET /v1/partitions``).

A client that shows many partitions at once — the coordinator's web console, with the
viewer's token — asks each node once instead of each partition's leader twice (offsets,
DescribeProducers). The list is filtered like the coordinator's metadata: a partition is
listed only when the caller may describe its topic, so it tells a caller nothing that the
per-partition routes would refuse. ``topic`` and the partition range narrow it to what a
page of one topic shows; ``producers=true`` adds each partition's DescribeProducers.

The numbers are the node's own, leader or follower (``leader`` says which): a follower's
high watermark trails its leader's, so a reader takes a partition's row from its leader.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import MAX_PARTITIONS_PER_TOPIC, TOPIC_NAME_PATTERN
from eos_protocol.listing import NodePartitionsResponse
from eos_security.access import Caller
from eos_server.envelope import error_responses
from partition_service.api.records import json_response
from partition_service.context import Node
from partition_service.partition import Partition

router = APIRouter(tags=["records"])

LAST_INDEX = MAX_PARTITIONS_PER_TOPIC - 1


def producer_rows(target: Partition) -> list[dict[str, Any]]:
    """The partition's DescribeProducers entries (slot 0), as ``/producers`` answers them."""
    return [
        {
            "producer_id": entry.producer_id,
            "producer_epoch": entry.epoch,
            "last_sequence": entry.last_sequence_of(0),
            "slot": 0,
            "coordinator_epoch": entry.coordinator_epoch,
            "current_txn_start_offset": entry.current_txn_first_offset,
            "last_timestamp_ms": entry.last_timestamp_ms,
            "current_txn_start_ms": entry.current_txn_start_ms,
        }
        for entry in list(target.engine.producers.producers.values())
    ]


def partition_row(topic: str, index: int, target: Partition, *, producers: bool
                  ) -> dict[str, Any]:
    """One entry of the list (``NodePartition``)."""
    row: dict[str, Any] = {
        "topic": topic, "partition": index, "leader": target.role.leads,
        "leader_epoch": target.role.leader_epoch, **target.offsets(),
        "log_end_offset": target.engine.log_end_offset,
        "producer_count": len(target.engine.producers.producers),
    }  # fmt: skip
    if producers:
        row["producers"] = producer_rows(target)
    return row


@router.get(
    "/v1/partitions",
    operation_id="describeNodePartitions",
    summary="Every partition on this node the caller may describe, with its offsets",
    response_model=NodePartitionsResponse,
    responses=error_responses(
        "UNAUTHENTICATED", "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"
    ),
)
async def describe_node_partitions(
    node: Node,
    caller: Caller,
    topic: Annotated[
        str | None,
        Query(pattern=TOPIC_NAME_PATTERN, description="Only this topic's partitions."),
    ] = None,
    first_partition: Annotated[
        int, Query(ge=0, le=LAST_INDEX, description="Only partitions from this index on.")
    ] = 0,
    last_partition: Annotated[
        int, Query(ge=0, le=LAST_INDEX, description="Only partitions up to this index.")
    ] = LAST_INDEX,
    producers: Annotated[
        bool, Query(description="Add each partition's DescribeProducers answer.")
    ] = False,
) -> Response:
    """Sorted by topic and partition. Needs describe on a topic to list its partitions:
    with ``topic``, describe on that topic (else TOPIC_AUTHORIZATION_FAILED); without,
    describe on some topic (else CLUSTER_AUTHORIZATION_FAILED), the others left out."""
    access = node.access
    if topic is not None:
        await access.require(caller, ResourceType.TOPIC, topic, Operation.DESCRIBE)
    else:
        await access.require_somewhere(caller, ResourceType.TOPIC, Operation.DESCRIBE)
    allowed: dict[str, bool] = {}
    chosen = [
        (key, target) for key, target in node.registry.partitions.items()
        if (topic is None or key[0] == topic) and first_partition <= key[1] <= last_partition
    ]  # fmt: skip
    chosen.sort(key=lambda item: item[0])
    rows = []
    for (name, index), target in chosen:
        may = allowed.get(name)
        if may is None:
            may = allowed[name] = access.allowed(
                caller, ResourceType.TOPIC, name, Operation.DESCRIBE
            )
        if may:
            rows.append(partition_row(name, index, target, producers=producers))
    return json_response({"node_id": node.settings.node_id, "partitions": rows})
