"""Transaction version 2 (KIP-890 part 2): the storage nodes add partitions and every
commit or abort bumps the producer epoch.

``transactions.transaction_version``: the protocol the id's producer speaks, given by its
``init``. Every existing row is a version-1 producer, which keeps today's behaviour.

``transactions.next_producer_id``: when a version-2 end would exhaust the epoch, the new
producer id the client continues with; the row switches to it when that transaction
completes. -1 (none) on every existing row. Indexed: a storage node's add for the new id
finds the row by it while the rollover is pending.

Revision ID: 0005
Revises: 0004
Create Date: 2027-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transactions") as batch:
        batch.add_column(
            sa.Column("transaction_version", sa.Integer, nullable=False, server_default="1")
        )
        batch.add_column(
            sa.Column("next_producer_id", sa.BigInteger, nullable=False, server_default="-1")
        )
    op.create_index("ix_transactions_next_producer_id", "transactions", ["next_producer_id"])


def downgrade() -> None:
    op.drop_index("ix_transactions_next_producer_id", table_name="transactions")
    with op.batch_alter_table("transactions") as batch:
        batch.drop_column("next_producer_id")
        batch.drop_column("transaction_version")
