"""The parts of a running coordinator, wired together once by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from coordinator_service.acls import AclRules
from coordinator_service.clock import Clock
from coordinator_service.cluster.instances import InstanceRegistry
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.controller.controller import Controller
from coordinator_service.controller.metadata import Metadata
from coordinator_service.controller.replication import Replication
from coordinator_service.db.engine import Database
from coordinator_service.groups.coordinator import GroupCoordinator
from coordinator_service.groups.lag_sampler import LagSampler
from coordinator_service.groups.offsets import GroupOffsets
from coordinator_service.hanging.detector import HangingDetector
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.settings import CoordinatorSettings
from coordinator_service.transactions.batcher import WriteBatcher
from coordinator_service.transactions.expiry import ExpiryScanner
from coordinator_service.transactions.lifecycle import TransactionCoordinator
from coordinator_service.transactions.markers import MarkerChannel
from coordinator_service.transactions.producer_ids import ProducerIdManager
from coordinator_service.transactions.store import TransactionStore
from eos_security.access import AccessControl


@dataclass
class Services:
    settings: CoordinatorSettings
    clock: Clock
    lease_clock: Clock
    db: Database
    store: TransactionStore
    http: httpx.AsyncClient
    metadata: Metadata
    producer_ids: ProducerIdManager
    markers: MarkerChannel
    coordinator: TransactionCoordinator
    leases: LeaseManager
    expiry: ExpiryScanner
    metrics: CoordinatorMetrics
    node_id: int
    writer: WriteBatcher
    access: AccessControl
    acl_rules: AclRules
    instances: InstanceRegistry
    controller: Controller
    replication: Replication
    hanging: HangingDetector
    groups: GroupCoordinator
    group_offsets: GroupOffsets
    group_lag: LagSampler
