"""Zombie fencing of transactional offset commits (KIP-447, with KIP-848's member epochs).

A copy of an application that stalled past its session has lost its partitions to
another copy; if it woke up and committed a transaction with its offsets, both copies'
output would be committed for the same input. So a transaction's AddOffsetsToTxn names
the group member the offsets belong to (``group_metadata()`` in the SDK), and the
coordinator refuses it when that member is gone (``UNKNOWN_MEMBER_ID``) or no longer
holds the partitions at that epoch (``FENCED_MEMBER_EPOCH``). The claim is stored and
checked again at commit: a member fenced between its AddOffsetsToTxn and its commit
cannot commit either. Both errors are abortable: the copy aborts and joins again.

Why this closes the window: a partition goes to a new member only after the group state
that removed it from the old one is durable, and the new member starts from the offsets
committed so far, waiting for any still pending (``require_stable``). Either the zombie's
commit was decided before that state was written (its offsets were pending, so the new
member waits for them and goes on after them) or after (and then this check refuses it).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from coordinator_service.db.engine import Database
from coordinator_service.groups import store
from coordinator_service.groups.membership import Member, Partitions
from coordinator_service.transactions.state import TxnRecord
from eos_protocol.coordinator import AddOffsetsRequest
from eos_protocol.errors import FencedMemberEpochError, UnknownMemberIdError


def check_member(
    group_id: str,
    member_id: str | None,
    member_epoch: int | None,
    partitions: Partitions | None,
    member: Member | None,
    member_count: int,
) -> None:
    """Raise unless offsets of ``partitions`` may be committed for this member now."""
    if member_id is None:
        if member_count:
            raise UnknownMemberIdError(
                f"group {group_id!r} has members: a transaction committing its offsets "
                "must name the member (pass consumer.group_metadata())"
            )
        return  # a group used with assign(): no membership to check, as in Kafka
    if member is None or member.left_static:
        raise UnknownMemberIdError(
            f"group {group_id!r} has no member {member_id!r} now (it left or its session "
            "timed out): its partitions may be another member's"
        )
    assert member_epoch is not None
    if member_epoch > member.member_epoch:
        raise FencedMemberEpochError(
            f"member {member_id!r} of group {group_id!r} claims epoch {member_epoch}, "
            f"newer than its epoch {member.member_epoch}"
        )
    if partitions is None:
        if member_epoch != member.member_epoch:
            raise FencedMemberEpochError(
                f"member {member_id!r} of group {group_id!r} is at epoch "
                f"{member.member_epoch}, not {member_epoch}"
            )
        return
    foreign = partitions - member.holds
    if foreign:
        shown = ", ".join(f"{t}-{p}" for t, p in sorted(foreign)[:5])
        raise FencedMemberEpochError(
            f"member {member_id!r} of group {group_id!r} (epoch {member.member_epoch}, "
            f"claimed {member_epoch}) does not own {shown}: it was fenced"
        )


class GroupFence:
    """The checks above, against the group state in the database (any coordinator
    instance can run them, whichever instance is the group's coordinator)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(
        self, transactional_id: str, producer_id: int, txn_start_ms: int, req: AddOffsetsRequest
    ) -> None:
        """AddOffsetsToTxn: check the member, and record the claim for the commit."""
        partitions = None if req.partitions is None else frozenset(
            (tp.topic, tp.partition) for tp in req.partitions
        )

        def run(conn: Connection) -> None:
            member, count = store.read_member(conn, req.group_id, req.member_id)
            check_member(req.group_id, req.member_id, req.member_epoch, partitions, member,
                         count)
            if req.member_id is not None and req.member_epoch is not None:
                store.write_claim(
                    conn, transactional_id, req.group_id, producer_id, txn_start_ms,
                    req.member_id, req.member_epoch, partitions or frozenset(),
                )

        await self._db.run(run)

    async def verify_commit(self, transactional_id: str, rec: TxnRecord) -> None:
        """At commit: every claim of this transaction still holds (a transaction that
        commits no offsets has none, and costs no read)."""
        if not rec.groups:
            return
        claims = await self._db.run(store.read_claims, transactional_id, rec.producer_id,
                                    rec.txn_start_ms or 0)
        for group_id, member_id, epoch, partitions, member, has_members in claims:
            check_member(group_id, member_id, epoch, partitions or None, member,
                         1 if has_members else 0)
