"""Wire models of the transaction coordinator (coordinator_service), docs/design.md §4."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from eos_protocol.common import (
    AnswerModel,
    IdString,
    PartitionIndex,
    ProducerEpoch,
    ProducerId,
    TopicName,
    TopicPartition,
    WireModel,
    examples,
)
from eos_protocol.states import TransactionState

MAX_TRANSACTION_TIMEOUT_MS = 900_000
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class KeyType(StrEnum):
    TRANSACTION = "transaction"
    GROUP = "group"


class NodeInfo(AnswerModel):
    node_id: int
    url: str


class PartitionInfo(AnswerModel):
    partition: int
    leader: NodeInfo
    created_on_node: bool = Field(
        default=True,
        description="False until the leader has created the partition; produce and fetch "
        "answer UNKNOWN_TOPIC_OR_PARTITION (retriable) until then.",
    )
    creation_error: str | None = Field(
        default=None,
        description="Why the leader refused to create the partition, when it did.",
    )


class TopicInfo(AnswerModel):
    """A topic and the storage node leading each partition."""

    model_config = examples(
        {
            "name": "orders",
            "partitions": [
                {"partition": 0, "leader": {"node_id": 1, "url": "http://127.0.0.1:8091"}}
            ],
        }
    )

    name: str
    partitions: list[PartitionInfo]


class MetadataResponse(AnswerModel):
    """The cluster: its storage nodes and every topic with its partition leaders."""

    model_config = examples(
        {
            "cluster_id": "4f1c2b9e",
            "nodes": [{"node_id": 1, "url": "http://127.0.0.1:8091"}],
            "coordinators": [{"node_id": 1, "url": "http://127.0.0.1:8080"}],
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition": 0, "leader": {"node_id": 1, "url": "http://127.0.0.1:8091"}}
                    ],
                }
            ],
        }
    )

    cluster_id: str
    nodes: list[NodeInfo]
    coordinators: list[NodeInfo] = Field(
        default_factory=list,
        description="The live coordinator instances (heartbeat within the lease time); "
        "clients and storage nodes fall over to them when the one they know is down.",
    )
    topics: list[TopicInfo]


class LiveCoordinators(AnswerModel):
    """The coordinator instances heard from within the lease time (storage nodes ask)."""

    model_config = examples(
        {
            "coordinators": [
                {"node_id": 1, "url": "http://127.0.0.1:8080"},
                {"node_id": 2, "url": "http://127.0.0.1:8081"},
            ]
        }
    )

    coordinators: list[NodeInfo]


class CreateTopicRequest(WireModel):
    """A new topic and its partition count."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "orders", "partitions": 3}]}
    )

    name: TopicName
    partitions: int = Field(ge=1, le=1000, examples=[3])


class FindCoordinatorResponse(AnswerModel):
    """Where to send a transactional id's (or a group's) calls."""

    model_config = examples(
        {
            "key": "orders-app",
            "key_type": "transaction",
            "node_id": 1,
            "url": "http://127.0.0.1:8080",
        }
    )

    key: str
    key_type: KeyType
    node_id: int
    url: str


class ProducerIdResponse(AnswerModel):
    """A producer id and its current epoch."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"producer_id": 1000, "producer_epoch": 0}]}
    )

    producer_id: int
    producer_epoch: int


class InitTransactionsRequest(WireModel):
    """InitProducerId for a transactional id; the producer fields only for KIP-360."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"transaction_timeout_ms": 60000}]}
    )

    transaction_timeout_ms: int = Field(default=DEFAULT_TRANSACTION_TIMEOUT_MS, examples=[60000])
    producer_id: ProducerId | None = None
    producer_epoch: ProducerEpoch | None = None


class AddPartitionsRequest(WireModel):
    """Partitions the transaction will write to."""

    model_config = ConfigDict(
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


class PartitionResult(AnswerModel):
    topic: str
    partition: int
    error: str | None


class AddPartitionsResponse(AnswerModel):
    """One result per partition asked for."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"partitions": [{"topic": "orders", "partition": 0, "error": None}]}]
        },
    )

    partitions: list[PartitionResult]


class AddOffsetsRequest(WireModel):
    """The consumer group whose offsets the transaction will commit."""

    model_config = ConfigDict(
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
        json_schema_extra={
            "examples": [{"producer_id": 1000, "producer_epoch": 0, "wait_for_markers": False}]
        },
    )

    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    wait_for_markers: bool = False


class EndTransactionResponse(AnswerModel):
    """The transaction's state once the decision is durable."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"transactional_id": "orders-app-1", "state": "PrepareCommit"}]
        },
    )

    transactional_id: str
    state: TransactionState


class TransactionDescription(AnswerModel):
    """A transactional id's state (DescribeTransactions)."""

    model_config = examples(
        {
            "transactional_id": "orders-app",
            "producer_id": 0,
            "producer_epoch": 0,
            "state": "CompleteAbort",
            "transaction_timeout_ms": 60000,
            "txn_start_ms": 1795322141297,
            "last_update_ms": 1795322141322,
            "partitions": [{"topic": "orders", "partition": 0}],
            "groups": [],
            "coordinator_epoch": 1,
        }
    )

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


class TransactionListing(AnswerModel):
    transactional_id: str
    producer_id: int
    state: TransactionState
    duration_ms: int | None


class ListTransactionsResponse(AnswerModel):
    """Transactional ids and their states (ListTransactions)."""

    model_config = examples(
        {
            "transactions": [
                {
                    "transactional_id": "orders-app",
                    "producer_id": 0,
                    "state": "Ongoing",
                    "duration_ms": 1200,
                }
            ]
        }
    )

    transactions: list[TransactionListing]


class ProducerTransactionView(AnswerModel):
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
