"""What request handlers share: the node's settings, partitions, verifier and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from eos_security.access import AccessControl
from partition_service.metrics import NodeMetrics
from partition_service.registry import PartitionRegistry
from partition_service.replication.manager import ReplicaManager
from partition_service.settings import NodeSettings
from partition_service.verification import TransactionVerifier


@dataclass
class NodeContext:
    settings: NodeSettings
    registry: PartitionRegistry
    verifier: TransactionVerifier
    metrics: NodeMetrics
    access: AccessControl
    replicas: ReplicaManager
    ready: bool = False


def get_node(request: Request) -> NodeContext:
    node: NodeContext = request.app.state.node
    return node


Node = Annotated[NodeContext, Depends(get_node)]
