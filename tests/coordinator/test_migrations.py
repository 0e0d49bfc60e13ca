"""The schema is made only by Alembic, and matches the table definitions the code uses."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from coordinator_service.db.engine import make_engine, upgrade
from coordinator_service.db.schema import metadata


def _check(url: str) -> None:
    engine = make_engine(url, pool_size=1)
    try:
        upgrade(engine)
        upgrade(engine)  # a second run is a no-op
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
            assert diff == [], diff
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def test_postgres_upgrade_head_matches_schema(pg_url: str) -> None:
    _check(pg_url)


def test_sqlite_upgrade_head_matches_schema(tmp_path: Path) -> None:
    _check(f"sqlite:///{tmp_path / 'c.db'}")


def test_downgrade_to_base_and_back(pg_url: str) -> None:
    from alembic import command

    from coordinator_service.db.engine import alembic_config

    engine = make_engine(pg_url, pool_size=1)
    try:
        upgrade(engine)
        cfg = alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert set(sa.inspect(engine).get_table_names()) == {"alembic_version"}
        upgrade(engine)
        assert "transactions" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
