"""Alembic environment: runs migrations on the connection the coordinator hands in, or on
the URL in ``sqlalchemy.url`` / ``EOS_DATABASE_URL`` when run from the alembic command.

The coordinator (``coordinator_service/db/migrate.py``) hands in a connection that is
already inside its transaction, with SQLite's foreign keys off, and an
``on_version_apply`` callback that checks each revision and records it: every pending
revision then runs in that one transaction, so a failure rolls all of them back.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

config = context.config
target_metadata = None


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("EOS_DATABASE_URL")
    if not url:
        raise RuntimeError("set EOS_DATABASE_URL or sqlalchemy.url to migrate")
    return url


def _configure(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # all revisions in one transaction (Alembic's default, stated because the
        # all-or-nothing upgrade depends on it)
        transaction_per_migration=False,
        on_version_apply=config.attributes.get("on_version_apply"),
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():  # joins the transaction the caller began
            context.run_migrations()
        return
    engine = sa.create_engine(_url(), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
