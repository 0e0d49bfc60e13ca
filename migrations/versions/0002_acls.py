"""Access control lists: one row per ACL binding (principal, resource pattern, operation,
permission).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "acls",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("principal", sa.String(140), nullable=False),
        sa.Column("resource_type", sa.String(32), nullable=False),
        sa.Column("resource_name", sa.String(249), nullable=False),
        sa.Column("pattern_type", sa.String(16), nullable=False),
        sa.Column("operation", sa.String(16), nullable=False),
        sa.Column("permission", sa.String(8), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint(
            "principal", "resource_type", "resource_name", "pattern_type", "operation",
            "permission", name="uq_acls_binding",
        ),
    )


def downgrade() -> None:
    op.drop_table("acls")
