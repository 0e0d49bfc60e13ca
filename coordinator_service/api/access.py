"""The rights each coordinator operation needs (Kafka's, operation by operation).

Shared by the FastAPI routes and their fast paths (``eos_server/fastpath.py``), so a request is
judged the same whichever of them answers it.

| operation | needs |
|---|---|
| init, commit, abort | write on the transactional id |
| add partitions | write on the transactional id and on every topic added |
| add offsets | write on the transactional id, read on the group |
| describe / list transactions | describe on the transactional id (lists are filtered) |
| force-abort, ACL changes | alter on the cluster; listing ACLs: describe on the cluster |
| create topic | create on the topic (or on the cluster) |
| metadata, describe topic | describe on the topic (metadata is filtered) |
| FindCoordinator | describe on the transactional id; read on the group |
| idempotent producer id | write on some topic (KIP-679) |
"""

from __future__ import annotations

from coordinator_service.services import Services
from eos_protocol.acl import CLUSTER_RESOURCE, Operation, ResourceType
from eos_protocol.common import TopicPartition
from eos_security.access import Caller

__all__ = ["Caller", "may_add_partitions", "may_create_topic", "may_write_transaction"]


async def may_write_transaction(services: Services, caller: str | None, tid: str) -> None:
    await services.access.require(caller, ResourceType.TRANSACTIONAL_ID, tid, Operation.WRITE)


async def may_add_partitions(
    services: Services, caller: str | None, tid: str, partitions: list[TopicPartition]
) -> None:
    """Nothing is added unless every topic may be written (a refusal changes nothing)."""
    await may_write_transaction(services, caller, tid)
    for topic in sorted({tp.topic for tp in partitions}):
        await services.access.require(caller, ResourceType.TOPIC, topic, Operation.WRITE)


async def may_create_topic(services: Services, caller: str | None, topic: str) -> None:
    access = services.access
    if access.allowed(caller, ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.CREATE):
        return
    await access.require(caller, ResourceType.TOPIC, topic, Operation.CREATE)
