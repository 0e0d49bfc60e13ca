"""Consumer group membership on the wire (KIP-848 over HTTP).

A member is one call: ``POST /v1/groups/{group_id}/heartbeat``. It joins with
``member_epoch`` 0, then heartbeats with the epoch the last answer gave it, and leaves
with -1 (-2 for a static member that will come back under the same ``instance_id``).
The coordinator computes every member's target assignment and hands it out
incrementally: a partition goes to its new owner only after the old owner stopped
reporting it in ``owned_partitions`` (it revoked it) or left the group. An answer always
carries the member's whole current assignment, so a client in any language needs no
state but its member id and epoch.

An HTTP client needs no group protocol library: a heartbeat loop, a diff of the
assignment it received against the partitions it reads, and ``owned_partitions`` sent
back once it has let go of what the answer no longer lists.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from eos_protocol.common import (
    MAX_EPOCH,
    AnswerModel,
    IdString,
    TopicName,
    TopicPartition,
    WireModel,
    examples,
)
from eos_protocol.node import OffsetCommitEntry

#: ``member_epoch`` of a join: the member has no epoch yet.
JOIN_EPOCH = 0
#: ``member_epoch`` of a member that leaves the group for good.
LEAVE_EPOCH = -1
#: ``member_epoch`` of a static member that leaves and will come back (its partitions wait
#: for it until its session times out).
STATIC_LEAVE_EPOCH = -2

#: The longest subscription regex a member may send.
MAX_REGEX_LENGTH = 1_000
#: The most topics one subscription may name.
MAX_SUBSCRIBED_TOPICS = 10_000

MemberEpoch = Annotated[int, Field(ge=STATIC_LEAVE_EPOCH, le=MAX_EPOCH, examples=[0])]
MemberId = Annotated[str, Field(min_length=1, max_length=64, examples=["4d3b0c1e8f2a"])]


class GroupHeartbeatRequest(WireModel):
    """One heartbeat of a member (ConsumerGroupHeartbeat).

    Fields left out (``null``) mean "unchanged since my last heartbeat"; a join must send
    a subscription. ``owned_partitions`` is what the member reads now: sending it after
    letting go of partitions acknowledges their revocation.
    """

    model_config = examples(
        {"member_epoch": 0, "subscribed_topic_names": ["orders"], "owned_partitions": []},
        {"member_id": "4d3b0c1e8f2a", "member_epoch": 3},
    )

    member_id: MemberId | None = Field(
        default=None,
        description="Null on a join (the coordinator makes one), the id it gave afterwards.",
    )
    member_epoch: MemberEpoch = Field(
        description="0 to join, the epoch of the last answer to heartbeat, -1 to leave, "
        "-2 for a static member to leave and keep its partitions until its session ends."
    )
    instance_id: IdString | None = Field(
        default=None,
        description="Static membership: a copy restarted with the same instance id takes "
        "its partitions back without moving anyone else's.",
    )
    rack_id: IdString | None = None
    rebalance_timeout_ms: int | None = Field(
        default=None, ge=1_000, le=3_600_000,
        description="How long the member may take to revoke partitions before it is "
        "removed from the group (default: the coordinator's).",
    )
    subscribed_topic_names: list[TopicName] | None = Field(
        default=None, max_length=MAX_SUBSCRIBED_TOPICS,
        description="The topics to read; each must exist. Null: unchanged.",
    )
    subscribed_topic_regex: str | None = Field(
        default=None, min_length=1, max_length=MAX_REGEX_LENGTH,
        description="A regular expression (Python syntax, matched against the whole name) "
        "instead of names; new topics that match join the subscription. Internal topics "
        "(starting with '__') never match.",
    )
    owned_partitions: list[TopicPartition] | None = Field(
        default=None,
        description="The partitions the member reads now. Null: unchanged.",
    )
    max_wait_ms: int = Field(
        default=0, ge=0, le=60_000,
        description="Hold the answer up to this long while nothing changes for the "
        "member, and answer as soon as its assignment does (a long poll): a member that "
        "sends its heartbeats this way learns of a move at once.",
    )


class MemberOffsetCommitRequest(WireModel):
    """A member's offsets, committed outside any transaction, checked against its
    membership first (Kafka's OffsetCommit with a member epoch): a member fenced since, or
    one that does not own a partition named, cannot move its offsets."""

    model_config = examples(
        {"member_id": "4d3b0c1e8f2a", "member_epoch": 3,
         "offsets": [{"topic": "orders", "partition": 0, "offset": 2, "metadata": None}]}
    )

    member_id: MemberId
    member_epoch: int = Field(ge=1, le=MAX_EPOCH)
    offsets: list[OffsetCommitEntry] = Field(min_length=1, max_length=100_000)


class GroupHeartbeatResponse(AnswerModel):
    """The member's id, epoch and whole current assignment."""

    model_config = examples(
        {
            "member_id": "4d3b0c1e8f2a",
            "member_epoch": 3,
            "heartbeat_interval_ms": 1_000,
            "session_timeout_ms": 10_000,
            "assignment": [{"topic": "orders", "partition": 0}],
        }
    )

    member_id: str
    member_epoch: int = Field(description="Send it with the next heartbeat; -1 after a leave.")
    heartbeat_interval_ms: int
    session_timeout_ms: int = Field(
        description="A member that does not heartbeat for this long is removed."
    )
    assignment: list[TopicPartition] = Field(
        description="Every partition the member may read now. A partition it reads that "
        "is missing here must be let go of (committed first), then left out of "
        "owned_partitions in the next heartbeat."
    )


GroupStateName = Literal["empty", "assigning", "reconciling", "stable"]


class GroupMemberDescription(AnswerModel):
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    state: str = Field(
        description="stable, unrevoked_partitions (it must let go of some first) or "
        "unreleased_partitions (it waits for others to let go)."
    )
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[TopicPartition]
    partitions_pending_revocation: list[TopicPartition]
    target_assignment: list[TopicPartition]
    client_host: str | None = None


class PartitionLag(AnswerModel):
    topic: str
    partition: int
    committed_offset: int | None = Field(description="Null when nothing is committed.")
    last_stable_offset: int | None = Field(description="Null when the leader did not answer.")
    lag: int | None = Field(description="last_stable_offset - committed_offset (or from 0).")
    owner: str | None = Field(description="The member id that owns the partition, if any.")


class GroupDescription(AnswerModel):
    """``GET /v1/groups/{group_id}``: members, assignment, epochs and lag."""

    model_config = examples(
        {
            "group_id": "order-enricher",
            "state": "stable",
            "group_epoch": 4,
            "assignment_epoch": 4,
            "members": [],
            "lag": [],
        }
    )

    group_id: str
    state: GroupStateName
    group_epoch: int
    assignment_epoch: int
    members: list[GroupMemberDescription]
    lag: list[PartitionLag] = Field(
        default_factory=list,
        description="Per subscribed partition: committed offset against the last stable "
        "offset (read_committed consumers can read no further).",
    )
    lag_error: str | None = Field(
        default=None,
        description="Why lag is missing (the node holding the group's offsets did not "
        "answer); the rest of the description stands.",
    )


class GroupListing(AnswerModel):
    group_id: str
    state: GroupStateName
    members: int
    group_epoch: int


class GroupList(AnswerModel):
    """``GET /v1/groups``: every group with members or a state on record."""

    model_config = examples(
        {"groups": [{"group_id": "order-enricher", "state": "stable", "members": 3,
                     "group_epoch": 4}]}
    )

    groups: list[GroupListing]


class ResetOffsetsRequest(WireModel):
    """Move an empty group's committed offsets (``eos groups reset``).

    Exactly one of ``to_earliest``, ``to_latest``, ``to_timestamp_ms`` or ``to_offset``.
    """

    model_config = examples({"topics": ["orders"], "to_earliest": True})

    topics: list[TopicName] = Field(min_length=1, max_length=MAX_SUBSCRIBED_TOPICS)
    to_earliest: bool = False
    to_latest: bool = False
    to_timestamp_ms: int | None = Field(default=None, ge=0)
    to_offset: int | None = Field(default=None, ge=0)


class ResetOffsetsResponse(AnswerModel):
    model_config = examples(
        {"offsets": [{"topic": "orders", "partition": 0, "offset": 0}]}
    )

    offsets: list[ResetOffset]


class ResetOffset(AnswerModel):
    topic: str
    partition: int
    offset: int


ResetOffsetsResponse.model_rebuild()
