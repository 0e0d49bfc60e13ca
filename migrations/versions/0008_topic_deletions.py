"""Topic deletion: ``topic_deletions``, a row per (deleted topic, storage node).

A deleted topic leaves the metadata tables at once; its replicas are removed from the
storage nodes afterwards, node by node, and each node's row stays until that node has
confirmed (``coordinator_service/controller/topic_deletion.py``). The name cannot be
created again while a row of it is left. A new table only: an older coordinator in a
rolling upgrade never reads it (and deletes nothing).

Revision ID: 0008
Revises: 0007
Create Date: 2027-05-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topic_deletions",
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("deleted_ms", sa.BigInteger, nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("topic_deletions")
