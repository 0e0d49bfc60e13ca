"""Wire models of the storage node (partition_service), docs/design.md §4."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from eos_protocol.common import (
    MAX_EPOCH,
    MAX_ID_LENGTH,
    AnswerModel,
    ErrorBody,
    IdString,
    Offset,
    PartitionIndex,
    ProducerEpoch,
    ProducerId,
    TopicName,
    TopicPartition,
    WireModel,
    examples,
)


class Encoding(StrEnum):
    UTF8 = "utf8"
    BASE64 = "base64"


class IsolationLevel(StrEnum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


class MarkerResult(StrEnum):
    COMMIT = "COMMIT"
    ABORT = "ABORT"


class RecordIn(WireModel):
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] | None = None
    timestamp_ms: int | None = Field(default=None, ge=0)


class ProduceRequest(WireModel):
    """One batch for one partition. Producer fields make it idempotent; ``transactional``
    makes it part of the producer's open transaction."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "producer_id": 1000,
                    "producer_epoch": 0,
                    "base_sequence": 0,
                    "transactional": True,
                    "records": [{"key": "order-1", "value": '{"amount": 12}'}],
                }
            ]
        },
    )

    producer_id: ProducerId | None = None
    producer_epoch: ProducerEpoch | None = None
    base_sequence: int | None = Field(default=None, ge=0, le=2**31 - 1)
    slot: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="The producer's sequence space this batch is numbered in (needs "
        "producer_id): several writers sharing one producer id and epoch, as the tasks of "
        "one Spark transaction, each number their batches from 0 in a slot of their own. "
        "Sequences and duplicates are per slot; the epoch and the transaction stay the "
        "producer's. Absent: slot 0, a producer's single sequence.",
    )
    transactional: bool = False
    encoding: Encoding = Encoding.UTF8
    acks: Literal[-1, 1] = Field(
        default=-1,
        description="-1 (all): answer once every in-sync replica has the batch; 1: once "
        "the leader has it. Idempotent and transactional batches need -1.",
    )
    records: list[RecordIn]


class ProduceResponse(AnswerModel):
    """Offsets of the batch (the first ones it got, when ``duplicate``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "base_offset": 0,
                    "last_offset": 0,
                    "duplicate": False,
                    "log_append_time_ms": 1700000000000,
                }
            ]
        },
    )

    base_offset: int
    last_offset: int
    duplicate: bool
    log_append_time_ms: int


class FetchedRecord(AnswerModel):
    offset: int
    key: str | None
    value: str | None
    headers: dict[str, str]
    timestamp_ms: int
    encoding: Encoding = Encoding.UTF8


class FetchResponse(AnswerModel):
    """Records from the asked offset on; control records are never returned."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "records": [
                        {
                            "offset": 0,
                            "key": "order-1",
                            "value": '{"amount": 12}',
                            "headers": {},
                            "timestamp_ms": 1700000000000,
                            "encoding": "utf8",
                        }
                    ],
                    "next_offset": 2,
                    "high_watermark": 4,
                    "last_stable_offset": 4,
                    "log_start_offset": 0,
                }
            ]
        },
    )

    records: list[FetchedRecord]
    next_offset: int = Field(description="Where the next fetch should start (past any gap).")
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class PartitionOffsets(AnswerModel):
    """A partition's log start, high watermark and last stable offset."""

    model_config = examples({"log_start_offset": 0, "high_watermark": 5, "last_stable_offset": 5})

    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class ProducerDescription(AnswerModel):
    producer_id: int
    producer_epoch: int
    last_sequence: int = Field(
        description="The last sequence written at producer_epoch in the asked slot (-1: none)."
    )
    slot: int = Field(
        default=0,
        description="The slot last_sequence is of: the one asked for, 0 when none was.",
    )
    coordinator_epoch: int
    current_txn_start_offset: int | None
    last_timestamp_ms: int
    current_txn_start_ms: int | None = Field(
        default=None,
        description="When the open transaction's first batch here was appended, by the "
        "node's clock like last_timestamp_ms (null: none open).",
    )


class DescribeProducersResponse(AnswerModel):
    """Producers with state on a partition (DescribeProducers)."""

    model_config = examples(
        {
            "producers": [
                {
                    "producer_id": 0,
                    "producer_epoch": 1,
                    "last_sequence": 2,
                    "slot": 0,
                    "coordinator_epoch": 1,
                    "current_txn_start_offset": None,
                    "last_timestamp_ms": 1795322141308,
                    "current_txn_start_ms": None,
                }
            ]
        }
    )

    producers: list[ProducerDescription]


# --- DescribeProducers of many partitions, ``POST /v1/producers/describe`` ---------------
# Kafka's DescribeProducers (KIP-664) names many partitions in one request to a broker. The
# Spark writers need as much before every commit (how far each (partition, slot) a task
# wrote got): one GET per partition made a write of thousands of partitions wait on
# thousands of sequential round trips; one request per leader node makes it a handful.

#: Entries in one request: the (partition, slot) pairs one commit asks a node about,
#: bounded as the other requests of many partitions are, so one request's work (and its
#: answer) stays within what a node does in one go.
MAX_DESCRIBE_ENTRIES = 10_000


class DescribeProducersEntry(WireModel):
    """One partition, and the slot whose last sequences its answer reports."""

    model_config = examples({"topic": "orders", "partition": 0, "slot": 3})

    topic: TopicName
    partition: PartitionIndex
    slot: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="The slot each producer's last_sequence is of (ProduceRequest.slot); "
        "0, a producer's single sequence, when absent (the GET's ?slot=).",
    )

    @property
    def asked_slot(self) -> int:
        return 0 if self.slot is None else self.slot


class DescribeProducersManyRequest(WireModel):
    """``POST /v1/producers/describe``: partitions of this node, each (partition, slot)
    named once (a partition may be named once per slot). Only a request malformed as a
    whole is refused, and then nothing is read."""

    model_config = examples(
        {"partitions": [
            {"topic": "orders", "partition": 0, "slot": 3},
            {"topic": "orders", "partition": 0, "slot": 4},
            {"topic": "orders", "partition": 1},
        ]}
    )  # fmt: skip

    partitions: list[DescribeProducersEntry] = Field(
        min_length=1, max_length=MAX_DESCRIBE_ENTRIES
    )

    @model_validator(mode="after")
    def _each_pair_once(self) -> DescribeProducersManyRequest:
        seen: set[tuple[str, int, int]] = set()
        for entry in self.partitions:
            where = (entry.topic, entry.partition, entry.asked_slot)
            if where in seen:
                raise ValueError(
                    f"{entry.topic}/{entry.partition} slot {entry.asked_slot} is named "
                    "twice: each (partition, slot) once per request"
                )
            seen.add(where)
        return self


class DescribedPartition(AnswerModel):
    """One entry's answer: the partition's producers as the per-partition GET lists them,
    or the error that kept it from being described (then no producers), which fails no
    other entry."""

    topic: str
    partition: int
    slot: int = Field(description="The slot asked (0 when none was).")
    producers: list[ProducerDescription]
    error: ErrorBody | None = Field(
        default=None, description="Why this partition was not described (null: it was)."
    )


class DescribeProducersManyResponse(AnswerModel):
    """One entry per entry asked, in the order asked."""

    model_config = examples(
        {"partitions": [
            {"topic": "orders", "partition": 0, "slot": 3, "error": None,
             "producers": [{"producer_id": 1000, "producer_epoch": 2, "last_sequence": 41,
                            "slot": 3, "coordinator_epoch": 1, "current_txn_start_offset": 120,
                            "last_timestamp_ms": 1795322141308,
                            "current_txn_start_ms": 1795322140112}]},
            {"topic": "orders", "partition": 1, "slot": 0, "producers": [],
             "error": {"code": "NOT_LEADER_OR_FOLLOWER", "retriable": True,
                       "message": "node 1 is a follower; the leader is node 2 (epoch 4)"}},
        ]}
    )  # fmt: skip

    partitions: list[DescribedPartition]


class OffsetCommitEntry(WireModel):
    topic: TopicName
    partition: PartitionIndex
    offset: Offset
    metadata: str | None = Field(default=None, max_length=4096)


class OffsetCommitRequest(WireModel):
    """A consumer group's offsets, committed outside any transaction."""

    model_config = examples(
        {"offsets": [{"topic": "orders", "partition": 0, "offset": 2, "metadata": None}]}
    )

    offsets: list[OffsetCommitEntry] = Field(min_length=1)


class TxnOffsetCommitRequest(WireModel):
    """A group's offsets inside a transaction (TxnOffsetCommit)."""

    model_config = examples(
        {
            "transactional_id": "orders-app",
            "producer_id": 0,
            "producer_epoch": 0,
            "offsets": [{"topic": "orders", "partition": 0, "offset": 2}],
        }
    )

    transactional_id: IdString
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    offsets: list[OffsetCommitEntry] = Field(min_length=1)


class OffsetCommitResponse(AnswerModel):
    offsets: list[OffsetCommitEntry]


class CommittedOffset(AnswerModel):
    topic: str
    partition: int
    offset: int
    metadata: str | None


class GroupOffsetsResponse(AnswerModel):
    """A group's committed offsets."""

    model_config = examples(
        {"offsets": [{"topic": "orders", "partition": 0, "offset": 2, "metadata": None}]}
    )

    offsets: list[CommittedOffset]


class Marker(WireModel):
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    coordinator_epoch: int = Field(ge=0, le=MAX_EPOCH)
    result: MarkerResult
    partitions: list[TopicPartition] = Field(min_length=1)


class WriteMarkersRequest(WireModel):
    """Transaction markers to write (coordinators only)."""

    model_config = examples(
        {
            "markers": [
                {
                    "producer_id": 0,
                    "producer_epoch": 0,
                    "coordinator_epoch": 1,
                    "result": "COMMIT",
                    "partitions": [{"topic": "orders", "partition": 0}],
                }
            ]
        }
    )

    markers: list[Marker] = Field(min_length=1)


class MarkerPartitionResult(AnswerModel):
    producer_id: int
    topic: str
    partition: int
    error: str | None = Field(description="An error code of the catalogue, or null.")


class WriteMarkersResponse(AnswerModel):
    results: list[MarkerPartitionResult]


class CreatePartitionRequest(WireModel):
    """What the coordinator knows of a partition it asks a node to create. A partition
    with several replicas is led by whoever the controller names: until its assignment
    reaches the node, the node leads it neither alone nor at once (a write acknowledged
    by one replica before the others follow it could be lost to an election)."""

    replicas: list[int] = Field(
        default_factory=list,
        max_length=1000,
        description="The partition's replicas (node ids); empty or one: led here alone "
        "until a controller says otherwise.",
    )


class CreatePartitionResponse(AnswerModel):
    topic: str
    partition: int
    created: bool = Field(description="False when the partition existed already.")


#: The most partitions one ``POST /internal/v1/partitions`` may carry: a coordinator
#: creating a topic of ten thousand partitions asks in a few requests, and no request holds
#: the node's creation lock for long.
MAX_PARTITIONS_PER_CREATE = 5_000


class PartitionToCreate(WireModel):
    """One partition of a batched creation. The topic is checked on its own, entry by
    entry (an illegal name refuses that entry, not the request), so the schema bounds its
    length only."""

    topic: str = Field(max_length=MAX_ID_LENGTH, examples=["orders"])
    partition: PartitionIndex
    replicas: list[int] = Field(
        default_factory=list,
        max_length=1000,
        description="As in CreatePartitionRequest: several replicas, and the partition "
        "waits for the controller's assignment before it serves as leader.",
    )


class CreatePartitionsRequest(WireModel):
    """Many partitions created on this node in one request (coordinators only): one
    round trip and one fsync of the data directory for the whole batch, where one request
    per partition made a topic of a thousand partitions take minutes."""

    model_config = examples(
        {
            "partitions": [
                {"topic": "orders", "partition": 0, "replicas": [1, 2, 3]},
                {"topic": "orders", "partition": 1, "replicas": [2, 3, 1]},
            ]
        }
    )

    partitions: list[PartitionToCreate] = Field(
        min_length=1, max_length=MAX_PARTITIONS_PER_CREATE
    )


class EntryError(AnswerModel):
    """Why one entry of a batch was refused; the other entries are answered on their own."""

    code: str = Field(description="A code of the error catalogue.", examples=["INVALID_REQUEST"])
    message: str = Field(description="Human-readable; do not parse.")


class CreatedPartition(AnswerModel):
    topic: str
    partition: int
    created: bool = Field(description="False when the partition existed already or was refused.")
    error: EntryError | None = Field(
        default=None, description="Why this partition was refused (null: it is on this node)."
    )


class CreatePartitionsResponse(AnswerModel):
    """One answer per entry, in the order asked."""

    model_config = examples(
        {
            "partitions": [
                {"topic": "orders", "partition": 0, "created": True, "error": None},
                {
                    "topic": "..",
                    "partition": 0,
                    "created": False,
                    "error": {
                        "code": "INVALID_REQUEST",
                        "message": "cannot create a partition of topic '..': "
                        "'..' is not a legal topic name",
                    },
                },
            ]
        }
    )

    partitions: list[CreatedPartition]


#: The most topics one ``POST /internal/v1/topics/delete`` may name.
MAX_TOPICS_PER_DELETE = 1_000


class DeleteTopicsOnNodeRequest(WireModel):
    """Topics deleted from the cluster whose replicas this node must remove (coordinators
    only): every partition of each topic this node holds is closed, forgotten and its
    directory deleted. Naming a topic the node holds nothing of is not an error (the
    coordinator asks every node, and asks again until each has answered)."""

    model_config = examples({"topics": ["orders-old"]})

    topics: list[str] = Field(min_length=1, max_length=MAX_TOPICS_PER_DELETE)


class DeletedTopicOnNode(AnswerModel):
    topic: str
    partitions_deleted: int = Field(
        description="How many partitions of the topic this node held and removed now "
        "(0: none held, already removed)."
    )
    error: EntryError | None = Field(
        default=None, description="Why this topic was refused (null: none of it is left here)."
    )


class DeleteTopicsOnNodeResponse(AnswerModel):
    """One answer per topic, in the order asked."""

    model_config = examples(
        {"topics": [{"topic": "orders-old", "partitions_deleted": 3, "error": None}]}
    )

    topics: list[DeletedTopicOnNode]


class PartitionSummary(AnswerModel):
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class ListPartitionsResponse(AnswerModel):
    node_id: int
    partitions: list[PartitionSummary]


__all__ = [
    "MAX_DESCRIBE_ENTRIES",
    "MAX_PARTITIONS_PER_CREATE",
    "MAX_TOPICS_PER_DELETE",
    "CommittedOffset",
    "CreatePartitionRequest",
    "CreatePartitionResponse",
    "CreatePartitionsRequest",
    "CreatePartitionsResponse",
    "CreatedPartition",
    "DeleteTopicsOnNodeRequest",
    "DeleteTopicsOnNodeResponse",
    "DeletedTopicOnNode",
    "DescribeProducersEntry",
    "DescribeProducersManyRequest",
    "DescribeProducersManyResponse",
    "DescribeProducersResponse",
    "DescribedPartition",
    "Encoding",
    "EntryError",
    "FetchResponse",
    "FetchedRecord",
    "GroupOffsetsResponse",
    "IsolationLevel",
    "ListPartitionsResponse",
    "Marker",
    "MarkerPartitionResult",
    "MarkerResult",
    "OffsetCommitEntry",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "PartitionIndex",
    "PartitionOffsets",
    "PartitionSummary",
    "PartitionToCreate",
    "ProduceRequest",
    "ProduceResponse",
    "ProducerDescription",
    "RecordIn",
    "TopicName",
    "TxnOffsetCommitRequest",
    "WriteMarkersRequest",
    "WriteMarkersResponse",
]
