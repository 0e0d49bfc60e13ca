"""Wire models of replication between storage nodes: a follower's fetch from its leader
and the epoch-end question it asks first (``docs/design.md`` section 7).

The fetch answer is not JSON: its body is the leader's frames byte for byte
(``application/octet-stream``), and the leader's offsets travel in headers, so a follower
stores exactly the bytes the leader stored, CRCs and leader epochs included.
"""

from __future__ import annotations

from pydantic import Field

from eos_protocol.common import AnswerModel, Offset, PartitionIndex, TopicName, WireModel

HIGH_WATERMARK_HEADER = "x-eos-high-watermark"
LOG_START_OFFSET_HEADER = "x-eos-log-start-offset"
LEADER_EPOCH_HEADER = "x-eos-leader-epoch"
FRAMES_MEDIA_TYPE = "application/octet-stream"


class ReplicaFetchRequest(WireModel):
    """A follower asks its leader for the frames from its own log end."""

    replica_id: int = Field(ge=0, description="The follower's node id.")
    topic: TopicName
    partition: PartitionIndex
    leader_epoch: int = Field(ge=0, description="The leader epoch the follower follows.")
    fetch_offset: Offset = Field(description="The follower's log end offset.")
    max_bytes: int = Field(default=1 << 20, ge=1, le=64 << 20)
    max_wait_ms: int = Field(default=500, ge=0, le=30_000)


class EpochEndAnswer(AnswerModel):
    """Where an epoch ended in the leader's log (Kafka's OffsetsForLeaderEpoch): the
    largest epoch at or below the one asked for, and its end offset; -1 and -1 when the
    leader knows no such epoch yet."""

    epoch: int
    end_offset: int
