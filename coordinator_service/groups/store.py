"""Reads and lease-fenced writes of consumer groups (``consumer_groups``, ``group_members``).

A write first takes the group's lease row ``FOR SHARE`` and checks that this instance
still holds it at the epoch it loaded the group under; only then does it replace the rows
(``writer.py`` batches many groups' writes into one transaction this way).
A takeover (an UPDATE of the lease row) therefore waits for a write under way, and a
paused ex-owner's late write finds the lease gone and changes nothing: the same fence as
transaction writes (``transactions/store.py``). Functions take a connection and never
commit: ``Database.run`` owns the transaction.

The rows are replaced whole (delete, then insert): a member row is small, and only the
members a heartbeat changed are written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.db.schema import consumer_groups, group_members, group_txn_claims
from coordinator_service.groups.membership import Group, Member, Partitions
from coordinator_service.transactions.store import LeaseToken, lease_held

G = consumer_groups
M = group_members
C = group_txn_claims


def dump_partitions(parts: Iterable[tuple[str, int]]) -> str:
    return orjson.dumps(sorted([t, p] for t, p in parts)).decode()


def load_partitions(text: str) -> Partitions:
    return frozenset((str(t), int(p)) for t, p in orjson.loads(text))


def member_values(group_id: str, m: Member) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "member_id": m.member_id,
        "instance_id": m.instance_id,
        "rack_id": m.rack_id,
        "client_host": m.client_host,
        "member_epoch": m.member_epoch,
        "previous_member_epoch": m.previous_member_epoch,
        "rebalance_timeout_ms": m.rebalance_timeout_ms,
        "subscribed_topic_names": orjson.dumps(list(m.subscribed_topic_names)).decode(),
        "subscribed_topic_regex": m.subscribed_topic_regex,
        "assigned": dump_partitions(m.assigned),
        "pending_revocation": dump_partitions(m.pending_revocation),
        "target": dump_partitions(m.target),
    }


def member_from_row(row: Any) -> Member:
    m = row._mapping
    return Member(
        member_id=m["member_id"],
        member_epoch=m["member_epoch"],
        previous_member_epoch=m["previous_member_epoch"],
        rebalance_timeout_ms=m["rebalance_timeout_ms"],
        instance_id=m["instance_id"],
        rack_id=m["rack_id"],
        client_host=m["client_host"],
        subscribed_topic_names=tuple(orjson.loads(m["subscribed_topic_names"])),
        subscribed_topic_regex=m["subscribed_topic_regex"],
        assigned=load_partitions(m["assigned"]),
        pending_revocation=load_partitions(m["pending_revocation"]),
        target=load_partitions(m["target"]),
    )


def load_group(conn: Connection, group_id: str) -> Group | None:
    row = conn.execute(sa.select(G).where(G.c.group_id == group_id)).first()
    if row is None:
        return None
    g = row._mapping
    group = Group(
        group_id=group_id,
        lease_partition=g["lease_partition"],
        group_epoch=g["group_epoch"],
        assignment_epoch=g["assignment_epoch"],
        subscribed_metadata={str(k): int(v) for k, v in
                             orjson.loads(g["subscribed_metadata"]).items()},
    )
    for mrow in conn.execute(sa.select(M).where(M.c.group_id == group_id)):
        member = member_from_row(mrow)
        group.members[member.member_id] = member
    return group


def holds_lease(conn: Connection, token: LeaseToken, now_ms: int) -> bool:
    """Whether the lease is still this instance's, locked against a takeover until the
    caller's transaction ends."""
    return bool(conn.execute(sa.select(lease_held(token, now_ms, lock=True))).scalar())


def group_values(group: Group) -> dict[str, Any]:
    return {
        "group_id": group.group_id, "lease_partition": group.lease_partition,
        "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
        "subscribed_metadata": orjson.dumps(group.subscribed_metadata).decode(),
    }


def write_rows(
    conn: Connection,
    group_id: str,
    group_row: dict[str, Any] | None,
    members: list[dict[str, Any]],
    removed: list[str],
    now_ms: int,
) -> None:
    """Replace the group's row (delete the group and all its rows when ``group_row`` is
    None), the rows of ``members`` and remove ``removed``; the caller checked the lease."""
    if group_row is None:
        conn.execute(M.delete().where(M.c.group_id == group_id))
        conn.execute(G.delete().where(G.c.group_id == group_id))
        conn.execute(C.delete().where(C.c.group_id == group_id))
        return
    conn.execute(G.delete().where(G.c.group_id == group_id))
    conn.execute(G.insert().values(**group_row, updated_ms=now_ms))
    gone = sorted(set(removed) | {m["member_id"] for m in members})
    for start in range(0, len(gone), 500):
        conn.execute(M.delete().where(
            M.c.group_id == group_id, M.c.member_id.in_(gone[start:start + 500])
        ))
    if members:
        conn.execute(M.insert(), members)


def list_groups(conn: Connection) -> list[tuple[str, int, int, int]]:
    """(group id, group epoch, assignment epoch, member count) of every group on record."""
    counts = (
        sa.select(M.c.group_id, sa.func.count().label("n"))
        .group_by(M.c.group_id).subquery()
    )
    q = (
        sa.select(G.c.group_id, G.c.group_epoch, G.c.assignment_epoch,
                  sa.func.coalesce(counts.c.n, 0))
        .select_from(G.outerjoin(counts, counts.c.group_id == G.c.group_id))
        .order_by(G.c.group_id)
    )
    return [(r[0], r[1], r[2], r[3]) for r in conn.execute(q)]


def group_ids_in(conn: Connection, lease_partitions: list[int]) -> list[str]:
    if not lease_partitions:
        return []
    q = sa.select(G.c.group_id).where(G.c.lease_partition.in_(lease_partitions))
    return [r[0] for r in conn.execute(q)]


# --- transaction claims (KIP-447) ---------------------------------------------------------


def write_claim(
    conn: Connection,
    transactional_id: str,
    group_id: str,
    producer_id: int,
    txn_start_ms: int,
    member_id: str,
    member_epoch: int,
    partitions: Partitions,
) -> None:
    conn.execute(C.delete().where(
        C.c.transactional_id == transactional_id, C.c.group_id == group_id
    ))
    conn.execute(C.insert().values(
        transactional_id=transactional_id, group_id=group_id, producer_id=producer_id,
        txn_start_ms=txn_start_ms, member_id=member_id, member_epoch=member_epoch,
        partitions=dump_partitions(partitions),
    ))


def read_claims(
    conn: Connection, transactional_id: str, producer_id: int, txn_start_ms: int
) -> list[tuple[str, str, int, Partitions, Member | None, bool]]:
    """The claims of this transaction, each with the member as stored now:
    (group, member id, claimed epoch, claimed partitions, member or None, group has members)."""
    q = sa.select(C).where(
        C.c.transactional_id == transactional_id, C.c.producer_id == producer_id,
        C.c.txn_start_ms == txn_start_ms,
    )
    out = []
    for row in conn.execute(q):
        c = row._mapping
        mrow = conn.execute(sa.select(M).where(
            M.c.group_id == c["group_id"], M.c.member_id == c["member_id"]
        )).first()
        others = conn.execute(
            sa.select(sa.func.count()).select_from(M).where(M.c.group_id == c["group_id"])
        ).scalar()
        out.append((
            c["group_id"], c["member_id"], c["member_epoch"],
            load_partitions(c["partitions"]),
            None if mrow is None else member_from_row(mrow), bool(others),
        ))
    return out


def read_member(conn: Connection, group_id: str, member_id: str | None
                ) -> tuple[Member | None, int]:
    """A member as stored now (None: no such member) and the group's member count."""
    member = None
    if member_id is not None:
        mrow = conn.execute(sa.select(M).where(
            M.c.group_id == group_id, M.c.member_id == member_id
        )).first()
        member = None if mrow is None else member_from_row(mrow)
    count = conn.execute(
        sa.select(sa.func.count()).select_from(M).where(M.c.group_id == group_id)
    ).scalar()
    return member, int(count or 0)
