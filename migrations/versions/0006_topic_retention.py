"""Topic retention: ``topics.retention_ms`` and ``topics.retention_bytes``.

A topic's records are kept this long and its partitions grow this large before the storage
nodes delete their oldest closed segments (docs/retention.md). -1 means unlimited, as in
Kafka, and is what every existing topic gets: a cluster upgraded to this version deletes
nothing until an operator sets a retention (``eos topics alter``). Topics created from now
on get the coordinator's ``default_retention_ms``/``default_retention_bytes`` when the
request names none.

Revision ID: 0006
Revises: 0005
Create Date: 2027-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("retention_ms", sa.BigInteger, nullable=False, server_default="-1")
        )
        batch.add_column(
            sa.Column("retention_bytes", sa.BigInteger, nullable=False, server_default="-1")
        )


def downgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("retention_bytes")
        batch.drop_column("retention_ms")
