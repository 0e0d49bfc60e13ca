"""A partition's role on this node, as the controller assigned it, and what the request
paths ask of it: may this replica take a produce, a fetch, a marker; is a batch replicated
enough to acknowledge.

A partition that no controller has spoken of (``assignment is None``) is led here alone,
as before replication existed, so a single node and topics of one replica behave exactly
as they always did. Not so a partition created as one of several replicas
(``awaits_controller``, kept on disk as the file ``replicated`` in its directory): until
the controller's assignment reaches this node — at creation, and again after every
restart — it serves nothing as leader (LEADER_NOT_AVAILABLE, retriable). Led alone, it
would acknowledge writes that no follower has, and an election of a follower would lose
them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eos_protocol.errors import (
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.replication import PartitionState, PartitionStatePush
from partition_service.replication.isr import LeaderReplicas

NO_LEADER = -1

#: The file that marks a partition directory as one replica of several.
REPLICATED_MARK = "replicated"


def mark_replicated(directory: Path) -> None:
    """Mark ``directory`` durably as one replica of several (before it serves anything)."""
    path = directory / REPLICATED_MARK
    with open(path, "wb") as f:
        f.write(b"1\n")
        f.flush()
        os.fsync(f.fileno())


def is_marked_replicated(directory: Path) -> bool:
    return (directory / REPLICATED_MARK).exists()


@dataclass(frozen=True)
class Assignment:
    """What the controller says of one partition (``PartitionState`` on the wire)."""

    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int
    retention_ms: int = -1  # the topic's retention, carried with the assignment
    retention_bytes: int = -1

    @classmethod
    def of(cls, state: PartitionState | PartitionStatePush) -> Assignment:
        """The wire's ``PartitionState`` (from a heartbeat answer or AlterPartition) or the
        controller's push, as this node keeps it."""
        return cls(
            leader=state.leader, leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch, replicas=tuple(state.replicas),
            isr=tuple(state.isr), min_insync_replicas=state.min_insync_replicas,
            retention_ms=state.retention_ms, retention_bytes=state.retention_bytes,
        )  # fmt: skip

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1


@dataclass
class Role:
    """This node's part in one partition: the assignment, and while leading, the view of
    the followers (``leader``)."""

    node_id: int
    assignment: Assignment | None = None
    leader: LeaderReplicas | None = None
    awaits_controller: bool = False  # one replica of several: never led here alone
    # its topic was deleted: a request that found the partition before (a produce waiting
    # for its replicas, a long poll) is answered UNKNOWN_TOPIC_OR_PARTITION, as a new one is
    deleted: bool = False

    @property
    def leads(self) -> bool:
        if self.deleted:
            return False
        if self.assignment is None:
            return not self.awaits_controller
        return self.leader is not None

    @property
    def leader_epoch(self) -> int | None:
        return None if self.assignment is None else self.assignment.leader_epoch

    def require_leader(self, *, acks_all: bool = False) -> None:
        """Refuse a request that only the leader may serve; with ``acks_all``, also one
        that too few in-sync replicas could acknowledge (before anything is written)."""
        self.require_present()
        if self.leads:
            if acks_all and self.leader is not None and not self.leader.enough_in_sync():
                raise NotEnoughReplicasError(
                    f"{len(self.leader.isr)} in-sync replicas {self.leader.isr}, fewer than "
                    f"min_insync_replicas {self.leader.min_insync_replicas}"
                )
            return
        if self.assignment is None:
            raise LeaderNotAvailableError(
                "this replica has not yet received its assignment from the controller"
            )
        if self.assignment.leader == NO_LEADER:
            raise LeaderNotAvailableError("the partition has no live leader now")
        raise NotLeaderOrFollowerError(
            f"node {self.node_id} is a follower; the leader is node {self.assignment.leader} "
            f"(epoch {self.assignment.leader_epoch})"
        )

    def require_present(self) -> None:
        """Refuse every request once the partition's topic is deleted from this node."""
        if self.deleted:
            raise UnknownTopicOrPartitionError("the partition was deleted from this node")

    def check_epoch(self, leader_epoch: int) -> None:
        """A request that names the leader epoch it expects: an older one is fenced, a
        newer one is not known here yet."""
        current = self.leader_epoch
        if current is None or leader_epoch == current:
            return
        if leader_epoch < current:
            raise FencedLeaderEpochError(
                f"leader epoch {leader_epoch} is older than this replica's {current}"
            )
        raise UnknownLeaderEpochError(
            f"leader epoch {leader_epoch} is newer than this replica's {current}"
        )
