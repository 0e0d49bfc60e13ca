"""A consumer group's members and how one heartbeat moves them (KIP-848), without I/O.

Three assignments matter for a member, as in Kafka's group coordinator:

* the **target**: what the assignor gave it for the group's current ``assignment_epoch``;
* **assigned**: what it may read now (its answer's ``assignment``);
* **pending revocation**: what it read before and must let go of first.

A heartbeat reconciles assigned towards target in two steps, so that no partition is ever
read by two members at once:

1. partitions no longer in the target are revoked: they leave ``assigned`` at once (the
   answer no longer lists them) and wait in ``pending_revocation`` until the member's
   ``owned_partitions`` stops listing them (it committed and let go) or the member is
   removed; its epoch stays;
2. with nothing left to revoke, the member's epoch moves to the assignment epoch and it
   gets every target partition that no other member still holds (assigned or pending
   revocation); those others hold it gets at a later heartbeat, once released.

Epochs fence. A heartbeat carries the epoch of the last answer; an older one means the
member missed a move and may be reading partitions that are someone else's now, so it is
refused (``FENCED_MEMBER_EPOCH``) and must join again with nothing. The one exception is
the previous epoch from a member whose answer was lost, when what it owns is still its
own. The group epoch counts changes of membership and subscription; the assignment epoch
says which group epoch the targets were computed for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from coordinator_service.groups.assignor import TopicPartitionKey

Partitions = frozenset[TopicPartitionKey]
NOTHING: Partitions = frozenset()


class MemberState(enum.StrEnum):
    STABLE = "stable"
    #: it must let go of partitions (pending revocation) before it gets more
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    #: it waits for partitions of its target that others still hold
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass
class Member:
    """One member as stored, plus its session deadlines (memory only: a new owner of the
    group gives every member a whole session from the moment it loads the group)."""

    member_id: str
    member_epoch: int
    previous_member_epoch: int
    rebalance_timeout_ms: int
    instance_id: str | None = None
    rack_id: str | None = None
    client_host: str | None = None
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    assigned: Partitions = NOTHING
    pending_revocation: Partitions = NOTHING
    target: Partitions = NOTHING
    session_deadline_ms: int = 0
    revocation_deadline_ms: int | None = None

    @property
    def state(self) -> MemberState:
        if self.pending_revocation:
            return MemberState.UNREVOKED_PARTITIONS
        if self.assigned != self.target:
            return MemberState.UNRELEASED_PARTITIONS
        return MemberState.STABLE

    @property
    def holds(self) -> Partitions:
        """Every partition this member may still be reading."""
        return self.assigned | self.pending_revocation

    @property
    def left_static(self) -> bool:
        """A static member that left with epoch -2 and keeps its partitions for now."""
        return self.member_epoch < 0


@dataclass
class Group:
    group_id: str
    lease_partition: int
    group_epoch: int = 0
    assignment_epoch: int = 0
    #: {topic: partition count} of the subscribed topics the targets were computed for
    subscribed_metadata: dict[str, int] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return "empty"
        if self.assignment_epoch < self.group_epoch:
            return "assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values() if not m.left_static):
            return "reconciling"
        return "stable"

    def by_instance(self, instance_id: str) -> Member | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def held_by_others(self, member_id: str) -> Partitions:
        held: set[TopicPartitionKey] = set()
        for other in self.members.values():
            if other.member_id != member_id:
                held |= other.holds
        return frozenset(held)


class EpochCheck(enum.Enum):
    CURRENT = "current"
    #: the previous epoch, from a member whose last answer was lost
    PREVIOUS = "previous"
    FENCED = "fenced"


def check_epoch(member: Member, epoch: int, owned: Partitions | None) -> EpochCheck:
    """Whether a heartbeat's ``member_epoch`` is one the member may send."""
    if epoch == member.member_epoch:
        return EpochCheck.CURRENT
    if (
        epoch == member.previous_member_epoch
        and owned is not None
        and owned <= member.assigned
    ):
        return EpochCheck.PREVIOUS
    return EpochCheck.FENCED


def reconcile(group: Group, member: Member, owned: Partitions | None, now_ms: int) -> bool:
    """Move ``member`` one step towards its target; True when anything changed.

    ``owned`` is what the member reported reading (None: not reported this time).
    """
    changed = False
    if member.pending_revocation and owned is not None and not (
        owned & member.pending_revocation
    ):
        member.pending_revocation = NOTHING  # it let go: the revocation is acknowledged
        member.revocation_deadline_ms = None
        changed = True
    if member.pending_revocation:
        return changed
    revoke = member.assigned - member.target
    if revoke:
        member.assigned = member.assigned & member.target
        member.pending_revocation = revoke
        member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
        return True
    if member.member_epoch != group.assignment_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = group.assignment_epoch
        changed = True
    wanted = member.target - member.assigned
    if wanted:
        free = wanted - group.held_by_others(member.member_id)
        if free:
            member.assigned = member.assigned | free
            changed = True
    return changed


def release(group: Group, member_id: str) -> Member | None:
    """Remove a member: what it held is free for others at their next heartbeat."""
    member = group.members.pop(member_id, None)
    if member is not None:
        group.group_epoch += 1
    return member


def expired(group: Group, now_ms: int) -> list[str]:
    """Members past their session, or past their rebalance timeout while revoking."""
    out = []
    for member in group.members.values():
        revoke_by = member.revocation_deadline_ms
        if member.session_deadline_ms <= now_ms or (revoke_by is not None and revoke_by <= now_ms):
            out.append(member.member_id)
    return sorted(out)
