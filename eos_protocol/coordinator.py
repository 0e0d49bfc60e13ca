"""Wire models of the transaction coordinator (coordinator_service), docs/design.md §4."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

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
from eos_protocol.versions import (
    PREVIOUS_RELEASE_FEATURES,
    TRANSACTION_VERSION_1,
    TRANSACTION_VERSION_2,
    ClusterFeatures,
    features_of_metadata,
)

MAX_TRANSACTION_TIMEOUT_MS = 900_000
MAX_REPLICATION_FACTOR = 100
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

TransactionVersion = Annotated[
    int,
    Field(
        ge=TRANSACTION_VERSION_1,
        le=TRANSACTION_VERSION_2,
        description="The transaction protocol the client speaks: 1 (the default, the "
        "client calls add-partitions) or 2 (the storage node adds each partition on the "
        "first batch; every commit or abort bumps the producer epoch).",
        examples=[2],
    ),
]


#: retention_ms / retention_bytes of a topic that keeps everything (as in Kafka).
UNLIMITED_RETENTION = -1
RetentionMs = Annotated[
    int,
    Field(ge=-1, le=2**62, description="Milliseconds, or -1 for ever.", examples=[86_400_000]),
]
RetentionBytes = Annotated[
    int,
    Field(ge=-1, le=2**62, description="Bytes per partition, or -1 without limit.",
          examples=[1_073_741_824]),
]  # fmt: skip


class KeyType(StrEnum):
    """``transaction``: the coordinator owning a transactional id. ``group``: the storage
    node holding a group's committed offsets. ``consumer_group``: the coordinator owning
    a group's membership (heartbeats)."""

    TRANSACTION = "transaction"
    GROUP = "group"
    CONSUMER_GROUP = "consumer_group"


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
        description="Why a replica refused to create the partition, when one did.",
    )
    replicas: list[int] = Field(
        default_factory=list,
        description="The nodes holding a copy, in placement order (the first is the "
        "preferred leader). Empty from a coordinator before replication.",
    )
    isr: list[int] = Field(
        default_factory=list, description="The in-sync replicas; the leader is among them."
    )
    leader_epoch: int = Field(default=0, description="Bumped at every change of leader.")
    under_replicated: bool = Field(
        default=False, description="Fewer in-sync replicas than replicas."
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
    replication_factor: int = Field(default=1, description="Copies of each partition.")
    min_insync_replicas: int = Field(
        default=1,
        description="In-sync replicas an acks=all produce needs (NOT_ENOUGH_REPLICAS below).",
    )
    retention_ms: int = Field(
        default=UNLIMITED_RETENTION,
        description="How long records are kept (-1: for ever). Whole closed segments "
        "whose newest record is older are deleted.",
    )
    retention_bytes: int = Field(
        default=UNLIMITED_RETENTION,
        description="Largest size of each partition's log (-1: no limit); the oldest "
        "closed segments are deleted while it is exceeded.",
    )


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
            "features": {
                "release": "0.3.0",
                "protocol": 2,
                "transaction_version": {"min": 1, "max": 2},
            },
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
    features: ClusterFeatures = Field(
        # read from a coordinator that names none: the previous release's (docs/design.md
        # "Versions and compatibility"), so every reader applies the one rule
        default_factory=lambda: PREVIOUS_RELEASE_FEATURES.model_copy(),
        description="What the answering coordinator understands: its release, its request "
        "protocol and the feature levels a request may ask for (KIP-584's finalized "
        "features). Absent from the releases before 0.3.0, which means protocol 1 and "
        "transaction version 1 only.",
    )

    @model_validator(mode="before")
    @classmethod
    def _features_of_an_earlier_release(cls, data: Any) -> Any:
        """An answer that names no features stands for the release its shape gives away
        (``features_of_metadata``): one rule for every reader."""
        if isinstance(data, dict) and "features" not in data:
            return {**data, "features": features_of_metadata(data)}
        return data


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


class DeleteTopicResponse(AnswerModel):
    """A topic deleted: gone from the metadata now (every request about it answers
    UNKNOWN_TOPIC_OR_PARTITION); its replicas are removed from the storage nodes in the
    background, and the name can be created again once every node has confirmed."""

    model_config = examples({"name": "orders-old", "partitions": 3, "pending_nodes": [1, 2, 3]})

    name: str
    partitions: int = Field(description="How many partitions the topic had.")
    pending_nodes: list[int] = Field(
        description="The storage nodes still to confirm that they removed its replicas."
    )


class CreateTopicRequest(WireModel):
    """A new topic, its partition count and how it is replicated."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"name": "orders", "partitions": 3},
                {"name": "payments", "partitions": 6, "replication_factor": 3,
                 "min_insync_replicas": 2},
                {"name": "clicks", "partitions": 3, "retention_ms": 86_400_000,
                 "retention_bytes": -1},
            ]
        }
    )

    name: TopicName
    partitions: int = Field(ge=1, le=1000, examples=[3])
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICATION_FACTOR,
        description="Copies of each partition, on distinct nodes (default: the "
        "coordinator's default_replication_factor). More than there are storage nodes is "
        "INVALID_REQUEST.",
    )
    min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICATION_FACTOR,
        description="In-sync replicas an acks=all produce needs, 1 to replication_factor "
        "(default: min(2, replication_factor)).",
    )
    unclean_leader_election: bool = Field(
        default=False,
        description="Whether a replica outside the ISR may become leader when no in-sync "
        "replica is alive (losing what it lacks).",
    )
    retention_ms: RetentionMs | None = Field(
        default=None,
        description="How long records are kept, -1 for ever (default: the coordinator's "
        "default_retention_ms).",
    )
    retention_bytes: RetentionBytes | None = Field(
        default=None,
        description="How large each partition may grow before its oldest segments go, -1 "
        "without limit (default: the coordinator's default_retention_bytes).",
    )


class AlterTopicConfigRequest(WireModel):
    """``PATCH /v1/topics/{topic}``: change a topic's retention. A field left out keeps
    its value; -1 makes it unlimited."""

    model_config = examples({"retention_ms": 3_600_000})

    retention_ms: RetentionMs | None = None
    retention_bytes: RetentionBytes | None = None


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
    transaction_version: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="The transaction protocol the coordinator uses with this producer: "
        "2 in the answer to an init that asked for it; absent otherwise (version 1).",
    )


class InitTransactionsRequest(WireModel):
    """InitProducerId for a transactional id; the producer fields only for KIP-360."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"transaction_timeout_ms": 60000}]}
    )

    transaction_timeout_ms: int = Field(default=DEFAULT_TRANSACTION_TIMEOUT_MS, examples=[60000])
    producer_id: ProducerId | None = None
    producer_epoch: ProducerEpoch | None = None
    transaction_version: TransactionVersion = TRANSACTION_VERSION_1


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
    member_id: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="The consumer's group member id (KIP-447): a member fenced since, or "
        "one that no longer owns `partitions`, cannot commit this transaction.",
    )
    member_epoch: int | None = Field(default=None, ge=1, le=2**31 - 1)
    partitions: list[TopicPartition] | None = Field(
        default=None, max_length=100_000,
        description="The partitions whose offsets the transaction commits (with member_id).",
    )

    @model_validator(mode="after")
    def _member_whole(self) -> AddOffsetsRequest:
        if (self.member_id is None) != (self.member_epoch is None):
            raise ValueError("member_id and member_epoch come together")
        if self.partitions is not None and self.member_id is None:
            raise ValueError("partitions need a member_id")
        return self


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
    """The transaction's state once the decision is durable, and the producer id and
    epoch the producer continues with (transaction version 2 bumps the epoch)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "transactional_id": "orders-app-1",
                    "state": "PrepareCommit",
                    "producer_id": 1000,
                    "producer_epoch": 1,
                }
            ]
        },
    )

    transactional_id: str
    state: TransactionState
    producer_id: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Transaction version 2 only: the producer id for the next "
        "transaction, the same one or, when the bump exhausted the epoch, a new one at "
        "epoch 0.",
    )
    producer_epoch: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Transaction version 2 only: the epoch for the next transaction, one "
        "more than the request's (0 with a new producer id).",
    )


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
    transaction_version: int = Field(
        default=TRANSACTION_VERSION_1,
        description="2: the node adds partitions itself (addProducerPartition).",
    )


class AddProducerPartitionRequest(WireModel):
    """Internal: a storage node adds the partition a transactional batch is about to
    open a transaction on (transaction version 2, KIP-890 part 2)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"producer_epoch": 3, "topic": "orders", "partition": 0}]
        },
    )

    producer_epoch: ProducerEpoch
    topic: TopicName
    partition: PartitionIndex


__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "MAX_REPLICATION_FACTOR",
    "MAX_TRANSACTION_TIMEOUT_MS",
    "TRANSACTION_VERSION_1",
    "TRANSACTION_VERSION_2",
    "UNLIMITED_RETENTION",
    "AddOffsetsRequest",
    "AddPartitionsRequest",
    "AddPartitionsResponse",
    "AddProducerPartitionRequest",
    "AlterTopicConfigRequest",
    "CreateTopicRequest",
    "DeleteTopicResponse",
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
    "RetentionBytes",
    "RetentionMs",
    "TopicInfo",
    "TransactionDescription",
    "TransactionListing",
    "TransactionVersion",
]
