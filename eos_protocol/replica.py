"""Wire models of replication between storage nodes: a follower's fetch from its leader
and the epoch-end question it asks first (``docs/design.md`` section 7).

The fetch answer is not JSON: its body is the leader's frames byte for byte
(``application/octet-stream``), and the leader's offsets travel in headers, so a follower
stores exactly the bytes the leader stored, CRCs and leader epochs included.
"""

from __future__ import annotations

from pydantic import Field

from eos_protocol.common import (
    MAX_EPOCH,
    AnswerModel,
    Offset,
    PartitionIndex,
    TopicName,
    WireModel,
    examples,
)

HIGH_WATERMARK_HEADER = "x-eos-high-watermark"
LOG_START_OFFSET_HEADER = "x-eos-log-start-offset"
LEADER_EPOCH_HEADER = "x-eos-leader-epoch"
FRAMES_MEDIA_TYPE = "application/octet-stream"


class ReplicaFetchRequest(WireModel):
    """A follower asks its leader for the frames from its own log end."""

    replica_id: int = Field(ge=0, description="The follower's node id.")
    topic: TopicName
    partition: PartitionIndex
    leader_epoch: int = Field(
        ge=0, le=MAX_EPOCH, description="The leader epoch the follower follows."
    )
    fetch_offset: Offset = Field(description="The follower's log end offset.")
    max_bytes: int = Field(default=1 << 20, ge=1, le=64 << 20)
    max_wait_ms: int = Field(default=500, ge=0, le=30_000)


class EpochEndAnswer(AnswerModel):
    """Where an epoch ended in the leader's log (Kafka's OffsetsForLeaderEpoch): the
    largest epoch at or below the one asked for, and its end offset; -1 and -1 when the
    leader knows no such epoch yet."""

    epoch: int
    end_offset: int


# -- one request for many partitions (Kafka's Fetch from a replica, and its
# OffsetsForLeaderEpoch, carry every partition a follower copies from one leader) ------

#: The answer of ``POST /internal/v1/replicas/fetch-many``: one line of JSON
#: (``ReplicaFetchManyHeader``), a newline, then each partition's frames in the order of
#: the header's entries, ``bytes`` long each.
REPLICA_BATCH_MEDIA_TYPE = "application/x-eos-replica-batch"
#: The most partitions one fetch-many or epoch-ends request may name.
MAX_BATCH_PARTITIONS = 10_000


class ReplicaFetchPartition(WireModel):
    """One partition of a follower's fetch-many: where its log ends, under which leader."""

    topic: TopicName
    partition: PartitionIndex
    leader_epoch: int = Field(
        ge=0, le=MAX_EPOCH, description="The leader epoch the follower follows."
    )
    fetch_offset: Offset = Field(description="The follower's log end offset.")
    max_bytes: int = Field(default=1 << 20, ge=1, le=64 << 20,
                           description="At most about this much of this partition.")  # fmt: skip


class ReplicaFetchManyRequest(WireModel):
    """A follower asks one leader node for every partition it copies from it, answered
    at once when any has frames (or an error), else when one gets some or after
    ``max_wait_ms``."""

    model_config = examples(
        {
            "replica_id": 2,
            "max_wait_ms": 500,
            "partitions": [
                {"topic": "orders", "partition": 0, "leader_epoch": 3, "fetch_offset": 120},
                {"topic": "orders", "partition": 1, "leader_epoch": 1, "fetch_offset": 0},
            ],
        }
    )

    replica_id: int = Field(ge=0, description="The follower's node id.")
    max_wait_ms: int = Field(default=500, ge=0, le=30_000)
    max_bytes: int = Field(default=10 << 20, ge=1, le=256 << 20,
                           description="At most about this much in all; the first "
                           "partition with frames is answered whole.")  # fmt: skip
    partitions: list[ReplicaFetchPartition] = Field(min_length=1, max_length=MAX_BATCH_PARTITIONS)


class ReplicaPartitionError(AnswerModel):
    code: str = Field(
        description="A code of the error catalogue.", examples=["NOT_LEADER_OR_FOLLOWER"]
    )
    message: str


class ReplicaFetchPartitionAnswer(AnswerModel):
    """One partition of a fetch-many answer: the leader's offsets and the size of its
    frames in the body, or the error that kept it from being served."""

    topic: str
    partition: int
    high_watermark: int = -1
    log_start_offset: int = -1
    leader_epoch: int = -1
    bytes: int = Field(default=0, ge=0, description="Its frames' length in the body.")
    error: ReplicaPartitionError | None = None


class ReplicaFetchManyHeader(AnswerModel):
    """The first line of a fetch-many answer."""

    partitions: list[ReplicaFetchPartitionAnswer]


class EpochEndQuestion(WireModel):
    topic: TopicName
    partition: PartitionIndex
    epoch: int = Field(ge=-1, le=MAX_EPOCH, description="The follower's latest epoch.")
    leader_epoch: int = Field(ge=0, le=MAX_EPOCH, description="The epoch the follower follows.")


class EpochEndsRequest(WireModel):
    """Where each of the follower's latest epochs ended in the leader's logs."""

    model_config = examples(
        {"partitions": [{"topic": "orders", "partition": 0, "epoch": 2, "leader_epoch": 3}]}
    )

    partitions: list[EpochEndQuestion] = Field(min_length=1, max_length=MAX_BATCH_PARTITIONS)


class EpochEndEntry(AnswerModel):
    topic: str
    partition: int
    epoch: int = -1
    end_offset: int = -1
    error: ReplicaPartitionError | None = None


class EpochEndsAnswer(AnswerModel):
    model_config = examples(
        {
            "partitions": [
                {"topic": "orders", "partition": 0, "epoch": 2, "end_offset": 118, "error": None}
            ]
        }
    )

    partitions: list[EpochEndEntry]
