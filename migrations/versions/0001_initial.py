"""Initial coordinator schema: cluster, instances, leases, producer-id blocks, topics,
partitions and the transaction log.

Revision ID: 0001
Revises:
Create Date: 2026-11-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("cluster_id", sa.String(64), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "coordinator_instances",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False, unique=True),
        sa.Column("url", sa.String(512), nullable=False),
        sa.Column("started_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("log_partition", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("owner_url", sa.String(512), nullable=True),
        sa.Column("owner_node_id", sa.Integer, nullable=True),
        sa.Column("coordinator_epoch", sa.Integer, nullable=False, server_default="0"),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "producer_id_blocks",
        sa.Column("block_start", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("block_end", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("allocated_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "topics",
        sa.Column("name", sa.String(249), primary_key=True),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("internal", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "topic_partitions",
        sa.Column("topic", sa.String(249), sa.ForeignKey("topics.name"), primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.Integer, nullable=False),
        sa.Column("created_on_node", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "transactions",
        sa.Column("transactional_id", sa.String(249), primary_key=True),
        sa.Column("txn_log_partition", sa.Integer, nullable=False),
        sa.Column("producer_id", sa.BigInteger, nullable=False),
        sa.Column("producer_epoch", sa.Integer, nullable=False),
        sa.Column("last_producer_id", sa.BigInteger, nullable=False),
        sa.Column("last_producer_epoch", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("timeout_ms", sa.Integer, nullable=False),
        sa.Column("txn_start_ms", sa.BigInteger, nullable=True),
        sa.Column("last_update_ms", sa.BigInteger, nullable=False),
        sa.Column("partitions", sa.Text, nullable=False),
        sa.Column("groups", sa.Text, nullable=False),
        sa.Column("coordinator_epoch", sa.Integer, nullable=False),
    )
    op.create_index(
        "ix_transactions_txn_log_partition", "transactions", ["txn_log_partition"]
    )
    op.create_index("ix_transactions_producer_id", "transactions", ["producer_id"])


def downgrade() -> None:
    op.drop_index("ix_transactions_producer_id", table_name="transactions")
    op.drop_index("ix_transactions_txn_log_partition", table_name="transactions")
    op.drop_table("transactions")
    op.drop_table("topic_partitions")
    op.drop_table("topics")
    op.drop_table("producer_id_blocks")
    op.drop_table("leases")
    op.drop_table("coordinator_instances")
    op.drop_table("cluster")
