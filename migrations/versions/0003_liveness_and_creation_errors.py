"""Coordinator heartbeats and partition-creation refusals.

``coordinator_instances.heartbeat_ms``: each instance writes it every lease round, so the
cluster's metadata can name the live instances (those whose heartbeat is younger than the
lease time) and clients and storage nodes can fall over to them.

``topic_partitions.creation_error``: why a storage node refused to create a partition (as
opposed to being unreachable), shown by ``describe topic`` instead of being retried in
silence.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("coordinator_instances") as batch:
        batch.add_column(
            sa.Column("heartbeat_ms", sa.BigInteger, nullable=False, server_default="0")
        )
    with op.batch_alter_table("topic_partitions") as batch:
        batch.add_column(sa.Column("creation_error", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("topic_partitions") as batch:
        batch.drop_column("creation_error")
    with op.batch_alter_table("coordinator_instances") as batch:
        batch.drop_column("heartbeat_ms")
