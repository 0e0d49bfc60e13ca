"""Migration 0006 (topic retention) on real PostgreSQL: a topic that existed before it keeps
everything (-1, -1); a downgrade takes the columns away and an upgrade brings them back."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from coordinator_service.db.engine import alembic_config, make_engine, upgrade


def _migrate(engine: sa.Engine, action: str, revision: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("topics")}


def test_existing_topics_keep_everything_and_the_downgrade_undoes_it(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1)
    try:
        _migrate(engine, "upgrade", "0005")
        assert "retention_ms" not in _columns(engine)
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO topics (name, partitions, internal, created_ms) "
                "VALUES ('old', 3, false, 1)"
            ))  # fmt: skip
        upgrade(engine)
        with engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT retention_ms, retention_bytes FROM topics WHERE name = 'old'")
            ).one()
        assert tuple(row) == (-1, -1)
        _migrate(engine, "downgrade", "0005")
        assert {"retention_ms", "retention_bytes"}.isdisjoint(_columns(engine))
        upgrade(engine)
        assert {"retention_ms", "retention_bytes"} <= _columns(engine)
    finally:
        engine.dispose()
