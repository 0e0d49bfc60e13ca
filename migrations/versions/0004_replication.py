"""Replication: replication factors, replica sets, ISR and epochs, node liveness, the
controller lease.

``topics`` gains ``replication_factor``, ``min_insync_replicas`` and
``unclean_leader_election``. ``topic_partitions`` gains the partition state the controller
keeps (docs/design.md §7): ``replicas`` and ``isr`` (JSON lists of node ids),
``leader_epoch`` and ``partition_epoch``; ``node_id`` stays the leader (-1 when none is
alive). Every existing partition becomes a replica set of one: ``replicas = isr =
[node_id]``, so a deployment from before replication behaves exactly as it did. A row
written without them (by a coordinator of an older version during a rolling upgrade) gets
the default ``[]``, which the code reads as ``[node_id]`` too.
``created_replicas`` records which replicas have created the partition, so the reconciler
asks each replica until all have it (``created_on_node`` is then true).

``node_heartbeats``: when each storage node was last heard from (its liveness).

The controller lease is one more ``leases`` row, at the reserved key -1; the
transaction-log leases are the rows from 0.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

CONTROLLER_LEASE = -1


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("replication_factor", sa.Integer, nullable=False, server_default="1")
        )
        batch.add_column(
            sa.Column("min_insync_replicas", sa.Integer, nullable=False, server_default="1")
        )
        batch.add_column(
            sa.Column(
                "unclean_leader_election", sa.Boolean, nullable=False,
                server_default=sa.false(),
            )
        )
    with op.batch_alter_table("topic_partitions") as batch:
        batch.add_column(sa.Column("replicas", sa.Text, nullable=False, server_default="[]"))
        batch.add_column(sa.Column("isr", sa.Text, nullable=False, server_default="[]"))
        batch.add_column(
            sa.Column("leader_epoch", sa.Integer, nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("partition_epoch", sa.Integer, nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("created_replicas", sa.Text, nullable=False, server_default="[]")
        )
    one = sa.literal("[") + sa.cast(sa.column("node_id"), sa.Text) + sa.literal("]")
    tp = sa.table(
        "topic_partitions",
        sa.column("node_id", sa.Integer),
        sa.column("replicas", sa.Text),
        sa.column("isr", sa.Text),
        sa.column("created_on_node", sa.Boolean),
        sa.column("created_replicas", sa.Text),
    )
    op.execute(tp.update().values(replicas=one, isr=one))
    op.execute(tp.update().where(tp.c.created_on_node == sa.true()).values(created_replicas=one))
    op.create_table(
        "node_heartbeats",
        sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("heartbeat_ms", sa.BigInteger, nullable=False),
        sa.Column("incarnation", sa.String(64), nullable=True),
    )
    leases = sa.table("leases", sa.column("log_partition", sa.Integer))
    op.execute(leases.insert().values(log_partition=CONTROLLER_LEASE))


def downgrade() -> None:
    leases = sa.table("leases", sa.column("log_partition", sa.Integer))
    op.execute(leases.delete().where(leases.c.log_partition == CONTROLLER_LEASE))
    op.drop_table("node_heartbeats")
    with op.batch_alter_table("topic_partitions") as batch:
        batch.drop_column("created_replicas")
        batch.drop_column("partition_epoch")
        batch.drop_column("leader_epoch")
        batch.drop_column("isr")
        batch.drop_column("replicas")
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("unclean_leader_election")
        batch.drop_column("min_insync_replicas")
        batch.drop_column("replication_factor")
