"""Consumer groups (KIP-848): ``consumer_groups``, ``group_members``, ``group_txn_claims``.

The group coordinator keeps each group's epochs, members, subscriptions and assignments
here, so a group survives a coordinator crash and the instance that takes the lease over
goes on from the last acknowledged state. ``group_txn_claims`` records the member a
transaction's offsets belong to (KIP-447); the commit checks it again. New tables only: an
older coordinator in a rolling upgrade never reads them.

Revision ID: 0007
Revises: 0006
Create Date: 2027-04-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumer_groups",
        sa.Column("group_id", sa.String(249), primary_key=True),
        sa.Column("lease_partition", sa.Integer, nullable=False),
        sa.Column("group_epoch", sa.Integer, nullable=False),
        sa.Column("assignment_epoch", sa.Integer, nullable=False),
        sa.Column("subscribed_metadata", sa.Text, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_consumer_groups_lease_partition", "consumer_groups", ["lease_partition"]
    )
    op.create_table(
        "group_members",
        sa.Column("group_id", sa.String(249), primary_key=True),
        sa.Column("member_id", sa.String(64), primary_key=True),
        sa.Column("instance_id", sa.String(249), nullable=True),
        sa.Column("rack_id", sa.String(249), nullable=True),
        sa.Column("client_host", sa.String(255), nullable=True),
        sa.Column("member_epoch", sa.Integer, nullable=False),
        sa.Column("previous_member_epoch", sa.Integer, nullable=False),
        sa.Column("rebalance_timeout_ms", sa.Integer, nullable=False),
        sa.Column("subscribed_topic_names", sa.Text, nullable=False),
        sa.Column("subscribed_topic_regex", sa.Text, nullable=True),
        sa.Column("assigned", sa.Text, nullable=False),
        sa.Column("pending_revocation", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
    )
    op.create_table(
        "group_txn_claims",
        sa.Column("transactional_id", sa.String(249), primary_key=True),
        sa.Column("group_id", sa.String(249), primary_key=True),
        sa.Column("producer_id", sa.BigInteger, nullable=False),
        sa.Column("txn_start_ms", sa.BigInteger, nullable=False),
        sa.Column("member_id", sa.String(64), nullable=False),
        sa.Column("member_epoch", sa.Integer, nullable=False),
        sa.Column("partitions", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("group_txn_claims")
    op.drop_table("group_members")
    op.drop_index("ix_consumer_groups_lease_partition", table_name="consumer_groups")
    op.drop_table("consumer_groups")
