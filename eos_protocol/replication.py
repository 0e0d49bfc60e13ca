"""Wire models of replication between the coordinator (the controller) and the storage
nodes, docs/design.md §7: node heartbeats and their answers, the partition state a node
learns its role from, and AlterPartition (ISR changes proposed by a leader).

The coordinator writes these, the nodes read them; they live here so that both sides
import one definition. Answer models ignore unknown fields, so the coordinator can add
state a node does not know yet.
"""

from __future__ import annotations

from pydantic import Field

from eos_protocol.common import (
    MAX_EPOCH,
    MAX_ID_LENGTH,
    AnswerModel,
    ErrorBody,
    PartitionIndex,
    TopicName,
    WireModel,
    examples,
)
from eos_protocol.coordinator import NodeInfo

#: The leader of a partition with no live leader (``PartitionState.leader``).
NO_LEADER = -1


class NodeHeartbeat(WireModel):
    """``POST /internal/v1/nodes/{node_id}/heartbeat``: the node is alive, at ``url``."""

    model_config = examples({"url": "http://127.0.0.1:8091"})

    url: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Where the node listens (left out: the URL the coordinators are "
        "configured with for it).",
    )
    incarnation: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Made anew at every start of the node process: when it changes, the "
        "node restarted (its disk may be empty), so it leaves every ISR and must catch up "
        "again before it can be elected.",
    )
    known_states: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The `states_digest` of the last answer whose states the node applied "
        "in full: when the node's states are still those, the answer leaves them out "
        "(`unchanged`). Sent only to a coordinator that answers a digest.",
    )


class PartitionState(AnswerModel):
    """One partition as the controller stored it: who leads, at which epochs, and who is
    in sync. A node leads when ``leader`` is its id and follows when it is among the
    ``replicas`` otherwise."""

    model_config = examples(
        {
            "topic": "orders",
            "partition": 0,
            "leader": 1,
            "leader_epoch": 3,
            "partition_epoch": 7,
            "replicas": [1, 2, 3],
            "isr": [1, 2],
            "min_insync_replicas": 2,
        }
    )

    topic: str
    partition: int
    leader: int = Field(description="The leader's node id, -1 when no leader is alive.")
    leader_epoch: int = Field(description="Bumped at every change of leader.")
    partition_epoch: int = Field(description="Bumped at every change of leader or ISR.")
    replicas: list[int] = Field(description="In placement order; the first is preferred.")
    isr: list[int] = Field(description="The in-sync replicas, the leader always among them.")
    min_insync_replicas: int = 1
    retention_ms: int = Field(default=-1, description="The topic's retention (-1: for ever).")
    retention_bytes: int = Field(
        default=-1, description="The topic's size limit per partition (-1: none)."
    )


class HeartbeatAnswer(AnswerModel):
    """The node's view of the cluster: every storage node, and every partition the node is
    a replica of."""

    model_config = examples(
        {
            "nodes": [{"node_id": 1, "url": "http://127.0.0.1:8091"}],
            "partitions": [
                {
                    "topic": "orders",
                    "partition": 0,
                    "leader": 1,
                    "leader_epoch": 0,
                    "partition_epoch": 0,
                    "replicas": [1],
                    "isr": [1],
                    "min_insync_replicas": 1,
                }
            ],
        }
    )

    nodes: list[NodeInfo]
    partitions: list[PartitionState]
    states_digest: str | None = Field(
        default=None,
        description="A digest of this node's partition states; the node sends it back as "
        "`known_states` and gets `unchanged` while they stay the same.",
    )
    unchanged: bool = Field(
        default=False,
        description="The node's states are those of its `known_states`: `partitions` is "
        "left empty, the node keeps what it has.",
    )


class PartitionStatePush(WireModel):
    """``PUT /internal/v1/partitions/{topic}/{partition}/state``: the controller's new
    assignment of one partition (its ``PartitionState`` without the topic and partition,
    which are in the path), and every node's URL, sent to each replica as soon as it
    changes (Kafka's LeaderAndIsr). Best effort: the next heartbeat answer carries it too."""

    model_config = examples(
        {"leader": 1, "leader_epoch": 3, "partition_epoch": 7, "replicas": [1, 2, 3],
         "isr": [1, 2], "min_insync_replicas": 2, "nodes": {"1": "http://127.0.0.1:8091"}}
    )  # fmt: skip

    leader: int = Field(ge=NO_LEADER)
    leader_epoch: int = Field(ge=0, le=MAX_EPOCH)
    partition_epoch: int = Field(ge=0, le=MAX_EPOCH)
    replicas: list[int] = Field(min_length=1)
    isr: list[int] = Field(min_length=1)
    min_insync_replicas: int = Field(default=1, ge=1)
    retention_ms: int = Field(default=-1, ge=-1)
    retention_bytes: int = Field(default=-1, ge=-1)
    nodes: dict[int, str] = Field(default_factory=dict, description="node id -> URL")


class PushAnswer(AnswerModel):
    """Whether the node took the pushed state (False: older than the one it holds)."""

    applied: bool


#: The most states one ``PUT /internal/v1/partition-states`` may carry (a controller with
#: more for one node sends several requests).
MAX_STATES_PER_PUSH = 5_000


class PushedState(PartitionState):
    """One state of a batched push: a ``PartitionState``, bounded as ``PartitionStatePush``
    is. Fields this version does not know are ignored, as in a heartbeat answer's states:
    a controller of a later version, whose states say more, still reaches this node."""

    topic: str = Field(max_length=MAX_ID_LENGTH)
    partition: PartitionIndex
    leader: int = Field(ge=NO_LEADER, description="The leader's node id, -1 when none is alive.")
    leader_epoch: int = Field(ge=0, le=MAX_EPOCH)
    partition_epoch: int = Field(ge=0, le=MAX_EPOCH)
    replicas: list[int] = Field(min_length=1)
    isr: list[int] = Field(min_length=1)
    min_insync_replicas: int = Field(default=1, ge=1)
    retention_ms: int = Field(default=-1, ge=-1)
    retention_bytes: int = Field(default=-1, ge=-1)


class PartitionStatesPush(WireModel):
    """``PUT /internal/v1/partition-states``: many partitions' new assignments for one node
    in one request, with every node's URL. A topic's creation or a node's failover changes
    thousands of states at once; one request per partition and replica made that thousands
    of requests. Best effort, as ``PartitionStatePush``."""

    model_config = examples(
        {
            "nodes": {"1": "http://127.0.0.1:8091", "2": "http://127.0.0.1:8092"},
            "states": [
                {"topic": "orders", "partition": 0, "leader": 1, "leader_epoch": 3,
                 "partition_epoch": 7, "replicas": [1, 2], "isr": [1, 2],
                 "min_insync_replicas": 2},
            ],
        }
    )  # fmt: skip

    nodes: dict[int, str] = Field(default_factory=dict, description="node id -> URL")
    states: list[PushedState] = Field(min_length=1, max_length=MAX_STATES_PER_PUSH)


class StateApplied(AnswerModel):
    """Whether the node took one pushed state: False when it is older than the one held,
    or the partition is not on this node (not an error: the node may not have it yet)."""

    topic: str
    partition: int
    applied: bool


class PartitionStatesAnswer(AnswerModel):
    """One answer per pushed state, in the order pushed."""

    model_config = examples(
        {"states": [{"topic": "orders", "partition": 0, "applied": True}]}
    )

    states: list[StateApplied]


class AlterIsrRequest(WireModel):
    """``POST /internal/v1/partitions/{topic}/{partition}/isr`` (AlterPartition, KIP-497):
    the leader proposes a new ISR at the epochs it knows."""

    model_config = examples(
        {"leader": 1, "leader_epoch": 3, "partition_epoch": 7, "isr": [1, 2, 3]}
    )

    leader: int = Field(ge=0)
    leader_epoch: int = Field(ge=0, le=MAX_EPOCH)
    partition_epoch: int = Field(ge=0, le=MAX_EPOCH)
    isr: list[int] = Field(min_length=1)


class IsrChange(WireModel):
    """One partition of a batched AlterPartition: the ISR its leader proposes, at the
    epochs the leader knows."""

    topic: TopicName
    partition: PartitionIndex
    leader_epoch: int = Field(ge=0, le=MAX_EPOCH)
    partition_epoch: int = Field(ge=0, le=MAX_EPOCH)
    isr: list[int] = Field(min_length=1)


class IsrChangesRequest(WireModel):
    """``POST /internal/v1/isr-changes``: a leader's ISR proposals for many partitions
    (Kafka's AlterPartition carries many), each decided on its own."""

    model_config = examples(
        {"leader": 1, "partitions": [{"topic": "orders", "partition": 0, "leader_epoch": 3,
                                      "partition_epoch": 7, "isr": [1, 2, 3]}]}
    )  # fmt: skip

    leader: int = Field(ge=0, description="The node id of the leader proposing.")
    partitions: list[IsrChange] = Field(min_length=1, max_length=MAX_STATES_PER_PUSH)


class IsrChangeOutcome(AnswerModel):
    """One proposal's outcome: the partition's state after it, or the error (with
    ``FENCED_LEADER_EPOCH``, the stored state in its ``details``)."""

    topic: str
    partition: int
    state: PartitionState | None = None
    error: ErrorBody | None = None


class IsrChangesAnswer(AnswerModel):
    model_config = examples(
        {"partitions": [{"topic": "orders", "partition": 0, "error": None, "state": {
            "topic": "orders", "partition": 0, "leader": 1, "leader_epoch": 3,
            "partition_epoch": 8, "replicas": [1, 2, 3], "isr": [1, 2, 3],
            "min_insync_replicas": 2, "retention_ms": -1, "retention_bytes": -1}}]}
    )  # fmt: skip

    partitions: list[IsrChangeOutcome]


__all__ = [
    "MAX_STATES_PER_PUSH",
    "NO_LEADER",
    "AlterIsrRequest",
    "HeartbeatAnswer",
    "IsrChange",
    "IsrChangeOutcome",
    "IsrChangesAnswer",
    "IsrChangesRequest",
    "NodeHeartbeat",
    "PartitionState",
    "PartitionStatePush",
    "PartitionStatesAnswer",
    "PartitionStatesPush",
    "PushAnswer",
    "PushedState",
    "StateApplied",
]
