"""Wire models of the transaction coordinator (coordinator_service), DESIGN.md §4."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from sdk.protocol.common import (
    IdString,
    PartitionIndex,
    ProducerEpoch,
    ProducerId,
    TopicName,
    TopicPartition,
    WireModel,
)
from sdk.protocol.states import TransactionState

MAX_TRANSACTION_TIMEOUT_MS = 900_000
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class KeyType(StrEnum):
    TRANSACTION = "transaction"
    GROUP = "group"


class NodeInfo(WireModel):
    node_id: int
    url: str


class PartitionInfo(WireModel):
    partition: int
    leader: NodeInfo


class TopicInfo(WireModel):
    name: str
    partitions: list[PartitionInfo]


class MetadataResponse(WireModel):
    cluster_id: str
    nodes: list[NodeInfo]
    topics: list[TopicInfo]


class CreateTopicRequest(WireModel):
    """A new topic and its partition count."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "orders", "partitions": 3}]}
    )

    name: TopicName
    partitions: int = Field(ge=1, le=1000, examples=[3])


class FindCoordinatorResponse(WireModel):
    key: str
    key_type: KeyType
    node_id: int
    url: str


class ProducerIdResponse(WireModel):
    """A producer id and its current epoch."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"producer_id": 1000, "producer_epoch": 0}]}
    )

    producer_id: int
    producer_epoch: int


class InitTransactionsRequest(WireModel):
    """InitProducerId for a transactional id; the producer fields only for KIP-360."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"transaction_timeout_ms": 60000}]}
    )

    transaction_timeout_ms: int = Field(default=DEFAULT_TRANSACTION_TIMEOUT_MS, examples=[60000])
    producer_id: ProducerId | None = None
    producer_epoch: ProducerEpoch | None = None


class AddPartitionsRequest(WireModel):
    """Partitions the transaction will write to."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "producer_id": 1000,
                    "producer_epoch": 0,
                    "partitions": [{"topic": "orders", "partition": 0}],
                }
            ]
        },
    )

    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    partitions: list[TopicPartition] = Field(min_length=1)


class PartitionResult(WireModel):
    topic: str
    partition: int
    error: str | None


class AddPartitionsResponse(WireModel):
    """One result per partition asked for."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"partitions": [{"topic": "orders", "partition": 0, "error": None}]}]
        },
    )

    partitions: list[PartitionResult]


class AddOffsetsRequest(WireModel):
    """The consumer group whose offsets the transaction will commit."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"producer_id": 1000, "producer_epoch": 0, "group_id": "order-enricher"}]
        },
    )

    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    group_id: IdString


class EndTransactionRequest(WireModel):
    """Commit or abort of the producer's open transaction."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"producer_id": 1000, "producer_epoch": 0, "wait_for_markers": False}]
        },
    )

    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    wait_for_markers: bool = False


class EndTransactionResponse(WireModel):
    """The transaction's state once the decision is durable."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"transactional_id": "orders-app-1", "state": "PrepareCommit"}]
        },
    )

    transactional_id: str
    state: TransactionState


class TransactionDescription(WireModel):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TransactionState
    transaction_timeout_ms: int
    txn_start_ms: int | None
    last_update_ms: int
    partitions: list[TopicPartition]
    groups: list[str]
    coordinator_epoch: int


class TransactionListing(WireModel):
    transactional_id: str
    producer_id: int
    state: TransactionState
    duration_ms: int | None


class ListTransactionsResponse(WireModel):
    transactions: list[TransactionListing]


class ProducerTransactionView(WireModel):
    """Internal: what a storage node asks before it opens a transaction on a partition
    (KIP-890 verification). ``partitions`` are those added to the current transaction."""

    producer_id: int
    producer_epoch: int
    transactional_id: str
    state: TransactionState
    partitions: list[TopicPartition]


__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "MAX_TRANSACTION_TIMEOUT_MS",
    "AddOffsetsRequest",
    "AddPartitionsRequest",
    "AddPartitionsResponse",
    "CreateTopicRequest",
    "EndTransactionRequest",
    "EndTransactionResponse",
    "FindCoordinatorResponse",
    "InitTransactionsRequest",
    "KeyType",
    "ListTransactionsResponse",
    "MetadataResponse",
    "NodeInfo",
    "PartitionIndex",
    "PartitionInfo",
    "PartitionResult",
    "ProducerIdResponse",
    "ProducerTransactionView",
    "TopicInfo",
    "TransactionDescription",
    "TransactionListing",
]
