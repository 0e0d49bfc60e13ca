"""Upgrading a database that holds data: every migration keeps what a deployment already
has, on SQLite (the embedded default, foreign keys on) and on PostgreSQL; one that fails
leaves the database exactly as it was and says which revision it was.

A user of an older release upgrades in place (``eos up`` again on the same data dir), so a
migration tested on an empty database proves little: on SQLite ``batch_alter_table``
rebuilds the table it changes, and dropping the old copy of a table that other rows
reference breaks a foreign key unless the migration runs with the checks off. Each case
here migrates a fresh database with Alembic to the lower revision (never ``create_all``),
fills every table that exists there, upgrades, and compares every row with what the
migrations promise for it (``PROMISED``, ``CREATED``).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from coordinator_service.cli import register
from coordinator_service.db import migrate
from coordinator_service.db.engine import MigrationError, alembic_config, make_engine, upgrade
from coordinator_service.db.schema import metadata
from tests.coordinator.conftest import CoordinatorFactory
from tests.support.coordinators import temp_database

Row = dict[str, Any]

#: The revisions in the order they apply, read from the scripts: a new migration is tested
#: here without anyone listing it (and fails until its columns have a ``PROMISED`` value).
REVISIONS: list[str] = [
    script.revision
    for script in reversed(list(ScriptDirectory.from_config(alembic_config()).walk_revisions()))
]
HEAD = REVISIONS[-1]
#: Every single step (base -> 0001 ... 0005 -> 0006) and every revision to head in one go,
#: as an upgrade over several releases runs them.
CASES: list[tuple[str, str]] = [
    *zip(["base", *REVISIONS[:-1]], REVISIONS, strict=True),
    *((start, "head") for start in ["base", *REVISIONS[:-2]]),
]

NOW = 1_767_225_600_000

#: What a deployment of the newest release holds; a database at an older revision gets the
#: columns it has. Values differ from the defaults the migrations fill in, so a migration
#: that overwrote one would be seen.
SEED: dict[str, list[Row]] = {
    "cluster": [{"id": 1, "cluster_id": "9b0c6f3e-old-release", "created_ms": NOW}],
    "coordinator_instances": [
        {"instance_id": "inst-a", "url": "http://10.0.0.1:9092", "started_ms": NOW + 1,
         "heartbeat_ms": NOW + 500},
        {"instance_id": "inst-b", "url": "http://10.0.0.2:9092", "started_ms": NOW + 2,
         "heartbeat_ms": NOW + 700},
    ],
    "leases": [
        {"log_partition": 0, "owner": "inst-a", "owner_url": "http://10.0.0.1:9092",
         "owner_node_id": 1, "coordinator_epoch": 4, "expires_at_ms": NOW + 9_000},
        {"log_partition": 1, "owner": "inst-b", "owner_url": "http://10.0.0.2:9092",
         "owner_node_id": 2, "coordinator_epoch": 2, "expires_at_ms": NOW + 9_500},
        {"log_partition": 2, "owner": None, "owner_url": None, "owner_node_id": None,
         "coordinator_epoch": 7, "expires_at_ms": 0},
    ],
    "producer_id_blocks": [
        {"block_start": 0, "block_end": 999, "owner": "inst-a", "allocated_ms": NOW + 10},
        {"block_start": 1000, "block_end": 1999, "owner": "inst-b", "allocated_ms": NOW + 20},
    ],
    "topics": [
        {"name": "orders", "partitions": 3, "internal": False, "created_ms": NOW + 100,
         "replication_factor": 3, "min_insync_replicas": 2, "unclean_leader_election": False,
         "retention_ms": 604_800_000, "retention_bytes": 1 << 30},
        {"name": "payments", "partitions": 1, "internal": False, "created_ms": NOW + 200,
         "replication_factor": 1, "min_insync_replicas": 1, "unclean_leader_election": True,
         "retention_ms": -1, "retention_bytes": 5_000_000},
        {"name": "__consumer_offsets", "partitions": 2, "internal": True,
         "created_ms": NOW + 50, "replication_factor": 2, "min_insync_replicas": 1,
         "unclean_leader_election": False, "retention_ms": -1, "retention_bytes": -1},
    ],
    "topic_partitions": [
        {"topic": "orders", "partition": 0, "node_id": 1, "created_on_node": True,
         "creation_error": None, "replicas": "[1, 2, 3]", "isr": "[1, 2]",
         "leader_epoch": 4, "partition_epoch": 9, "created_replicas": "[1, 2, 3]"},
        {"topic": "orders", "partition": 1, "node_id": 2, "created_on_node": True,
         "creation_error": None, "replicas": "[2, 3, 1]", "isr": "[2, 3, 1]",
         "leader_epoch": 1, "partition_epoch": 1, "created_replicas": "[2, 3, 1]"},
        {"topic": "orders", "partition": 2, "node_id": 3, "created_on_node": False,
         "creation_error": "node 3 refused: no space left on device",
         "replicas": "[3, 1, 2]", "isr": "[3]", "leader_epoch": 0, "partition_epoch": 2,
         "created_replicas": "[1]"},
        {"topic": "payments", "partition": 0, "node_id": 2, "created_on_node": False,
         "creation_error": None, "replicas": "[2]", "isr": "[2]", "leader_epoch": 0,
         "partition_epoch": 0, "created_replicas": "[]"},
        {"topic": "__consumer_offsets", "partition": 0, "node_id": 1, "created_on_node": True,
         "creation_error": None, "replicas": "[1, 2]", "isr": "[1, 2]", "leader_epoch": 2,
         "partition_epoch": 3, "created_replicas": "[1, 2]"},
        {"topic": "__consumer_offsets", "partition": 1, "node_id": 2, "created_on_node": True,
         "creation_error": None, "replicas": "[2, 1]", "isr": "[2]", "leader_epoch": 5,
         "partition_epoch": 6, "created_replicas": "[2, 1]"},
    ],
    "transactions": [
        {"transactional_id": tid, "txn_log_partition": log, "producer_id": pid,
         "producer_epoch": epoch, "last_producer_id": pid, "last_producer_epoch": epoch - 1,
         "state": state, "timeout_ms": 60_000, "txn_start_ms": start,
         "last_update_ms": NOW + 3_000, "partitions": parts, "groups": groups,
         "coordinator_epoch": 4 if log == 0 else 2, "transaction_version": version,
         "next_producer_id": next_pid}
        for tid, log, pid, epoch, state, start, parts, groups, version, next_pid in [
            ("t-empty", 0, 1000, 1, "Empty", None, "[]", "[]", 1, -1),
            ("t-ongoing", 1, 1001, 3, "Ongoing", NOW + 2_000,
             '[["orders", 0], ["payments", 0]]', '["billing"]', 1, -1),
            ("t-prepare-commit", 0, 1002, 2, "PrepareCommit", NOW + 2_100,
             '[["orders", 1]]', "[]", 2, -1),
            ("t-prepare-abort", 1, 1003, 5, "PrepareAbort", NOW + 2_200,
             '[["orders", 2]]', '["billing", "audit"]', 1, -1),
            ("t-complete-commit", 0, 1004, 32766, "CompleteCommit", None, "[]", "[]",
             2, 1005),
            ("t-complete-abort", 1, 1006, 9, "CompleteAbort", None, "[]", "[]", 1, -1),
            ("t-fence", 0, 1007, 4, "PrepareEpochFence", NOW + 2_300, '[["payments", 0]]',
             "[]", 1, -1),
            ("t-dead", 1, 1008, 1, "Dead", None, "[]", "[]", 1, -1),
        ]
    ],
    "acls": [
        {"principal": "User:alice", "resource_type": "TOPIC", "resource_name": "orders",
         "pattern_type": "LITERAL", "operation": "WRITE", "permission": "ALLOW",
         "created_ms": NOW + 400},
        {"principal": "User:bob", "resource_type": "GROUP", "resource_name": "bill",
         "pattern_type": "PREFIXED", "operation": "READ", "permission": "DENY",
         "created_ms": NOW + 401},
    ],
    "node_heartbeats": [
        {"node_id": 1, "url": "http://10.0.1.1:9100", "heartbeat_ms": NOW + 800,
         "incarnation": "inc-1"},
        {"node_id": 2, "url": "http://10.0.1.2:9100", "heartbeat_ms": NOW + 810,
         "incarnation": None},
    ],
    "consumer_groups": [
        {"group_id": "billing", "lease_partition": 1, "group_epoch": 7,
         "assignment_epoch": 6, "subscribed_metadata": '{"orders": 3}',
         "updated_ms": NOW + 900},
    ],
    "group_members": [
        {"group_id": "billing", "member_id": "m-1", "instance_id": "copy-1",
         "rack_id": None, "client_host": "10.0.2.1", "member_epoch": 7,
         "previous_member_epoch": 6, "rebalance_timeout_ms": 45_000,
         "subscribed_topic_names": '["orders"]', "subscribed_topic_regex": None,
         "assigned": '{"orders": [0, 1]}', "pending_revocation": "{}",
         "target": '{"orders": [0, 1, 2]}'},
    ],
    "group_txn_claims": [
        {"transactional_id": "t-ongoing", "group_id": "billing", "producer_id": 1001,
         "txn_start_ms": NOW + 2_000, "member_id": "m-1", "member_epoch": 7,
         "partitions": '[["orders", 0]]'},
    ],
    "topic_deletions": [
        {"topic": "old-orders", "node_id": 2, "deleted_ms": NOW + 950, "partitions": 4},
    ],
}

#: Rows a migration creates, which a running deployment then changes: updated by primary
#: key when the revision has them (the controller lease, taken by an instance).
SEED_UPDATES: dict[str, list[Row]] = {
    "leases": [
        {"log_partition": -1, "owner": "inst-a", "owner_url": "http://10.0.0.1:9092",
         "owner_node_id": 1, "coordinator_epoch": 3, "expires_at_ms": NOW + 9_100},
    ],
}

#: Rows each migration inserts (as of that revision's columns).
CREATED: dict[str, dict[str, list[Row]]] = {
    "0004": {
        "leases": [
            {"log_partition": -1, "owner": None, "owner_url": None, "owner_node_id": None,
             "coordinator_epoch": 0, "expires_at_ms": 0},
        ],
    },
}


def _one(row: Row) -> str:
    return f"[{row['node_id']}]"


#: What each column added after the first revision holds on the rows that existed before
#: it, as the migration that adds it promises (its docstring).
PROMISED: dict[tuple[str, str], Callable[[Row], Any]] = {
    # 0003
    ("coordinator_instances", "heartbeat_ms"): lambda _row: 0,
    ("topic_partitions", "creation_error"): lambda _row: None,
    # 0004: a deployment from before replication behaves exactly as it did
    ("topics", "replication_factor"): lambda _row: 1,
    ("topics", "min_insync_replicas"): lambda _row: 1,
    ("topics", "unclean_leader_election"): lambda _row: False,
    ("topic_partitions", "replicas"): _one,
    ("topic_partitions", "isr"): _one,
    ("topic_partitions", "leader_epoch"): lambda _row: 0,
    ("topic_partitions", "partition_epoch"): lambda _row: 0,
    ("topic_partitions", "created_replicas"): lambda row: (
        _one(row) if row["created_on_node"] else "[]"
    ),
    # 0005: every existing transactional id is a version-1 producer, with no rollover
    ("transactions", "transaction_version"): lambda _row: 1,
    ("transactions", "next_producer_id"): lambda _row: -1,
    # 0006: unlimited retention, nothing deleted until an operator sets one
    ("topics", "retention_ms"): lambda _row: -1,
    ("topics", "retention_bytes"): lambda _row: -1,
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new empty database of each dialect: a file, or a throw-away PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'coordinator.db'}"
    else:
        with temp_database() as pg_url:
            yield pg_url


def _tables(conn: sa.Connection) -> dict[str, sa.Table]:
    """The database's tables but Alembic's own, referenced ones before those that refer."""
    meta = sa.MetaData()
    meta.reflect(conn)
    return {t.name: t for t in meta.sorted_tables if t.name != "alembic_version"}


def _sort_key(row: Row) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def _rows(conn: sa.Connection, table: sa.Table) -> list[Row]:
    return sorted(
        (dict(r._mapping) for r in conn.execute(sa.select(table))), key=_sort_key
    )


def snapshot(engine: sa.Engine) -> dict[str, list[Row]]:
    """Every row of every table (but Alembic's own)."""
    with engine.connect() as conn:
        return {name: _rows(conn, table) for name, table in sorted(_tables(conn).items())}


def version(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def seed(engine: sa.Engine) -> None:
    """Fill every table of the database's revision with ``SEED`` (the columns it has)."""
    with engine.begin() as conn:
        tables = _tables(conn)
        missing = set(tables) - set(SEED)
        assert not missing, f"no SEED rows for {sorted(missing)}: add representative ones"
        for name, table in tables.items():
            for row in SEED[name]:
                conn.execute(table.insert().values({k: v for k, v in row.items() if k in table.c}))
            for row in SEED_UPDATES.get(name, []):
                key = [table.c[col.name] == row[col.name] for col in table.primary_key]
                values = {k: v for k, v in row.items() if k in table.c}
                conn.execute(table.update().where(*key).values(values))


def expected_after(
    before: dict[str, list[Row]], start: str, target: str, columns: dict[str, list[str]]
) -> dict[str, list[Row]]:
    """The rows an upgrade from ``start`` to ``target`` must leave: those there before, with
    each column a migration added holding what it promises, plus the rows migrations made."""
    lower = 0 if start == "base" else REVISIONS.index(start) + 1
    upper = len(REVISIONS) if target == "head" else REVISIONS.index(target) + 1
    rows: dict[str, list[Row]] = {name: list(before.get(name, [])) for name in columns}
    for revision in REVISIONS[lower:upper]:
        for name, made in CREATED.get(revision, {}).items():
            rows[name].extend(made)
    out: dict[str, list[Row]] = {}
    for name, table_rows in rows.items():
        filled = []
        for row in table_rows:
            full = dict(row)
            for column in columns[name]:
                if column not in full:
                    assert (name, column) in PROMISED, f"what does {name}.{column} hold?"
                    full[column] = PROMISED[(name, column)](row)
            filled.append(full)
        out[name] = sorted(filled, key=_sort_key)
    return out


def prepare(url: str, start: str) -> tuple[sa.Engine, dict[str, list[Row]]]:
    """A database at ``start`` holding ``SEED``; the engine (one pooled connection, so the
    migration's connection is the one the checks below use) and the rows it holds."""
    engine = make_engine(url, pool_size=1)
    if start != "base":
        upgrade(engine, start)
        seed(engine)
    assert version(engine) == (None if start == "base" else start)
    return engine, snapshot(engine)


def check_foreign_keys_enforced(engine: sa.Engine) -> None:
    """The upgrade gave back a connection that enforces foreign keys, and broke none."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        fks = sa.inspect(conn).get_foreign_keys("topic_partitions")
        assert [(fk["referred_table"], fk["referred_columns"]) for fk in fks] == [
            ("topics", ["name"])
        ]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO topic_partitions (topic, partition, node_id) VALUES ('nowhere', 0, 1)"
        ))  # fmt: skip


@pytest.mark.parametrize(("start", "target"), CASES, ids=[f"{a}-to-{b}" for a, b in CASES])
def test_upgrade_keeps_every_row(url: str, start: str, target: str) -> None:
    engine, before = prepare(url, start)
    try:
        upgrade(engine, target)
        assert version(engine) == (HEAD if target == "head" else target)
        after = snapshot(engine)
        with engine.connect() as conn:
            columns = {name: [c.name for c in t.columns] for name, t in _tables(conn).items()}
        assert after == expected_after(before, start, target, columns)
        check_foreign_keys_enforced(engine)
        if target == "head":
            with engine.connect() as conn:
                diff = compare_metadata(MigrationContext.configure(conn), metadata)
            assert diff == [], diff
            with engine.begin() as conn:  # the ids go on from the rows kept
                conn.execute(sa.text(
                    "INSERT INTO acls (principal, resource_type, resource_name, pattern_type,"
                    " operation, permission, created_ms)"
                    " VALUES ('User:carol', 'TOPIC', 'x', 'LITERAL', 'READ', 'ALLOW', 1)"
                ))  # fmt: skip
                conn.execute(sa.text(
                    "INSERT INTO coordinator_instances (instance_id, url, started_ms)"
                    " VALUES ('inst-c', 'http://10.0.0.3:9092', 1)"
                ))  # fmt: skip
    finally:
        engine.dispose()


# A failing migration -----------------------------------------------------------------

PLANTED = "9901"
PLANTED_TITLE = "Planted failure: a revision that breaks half-way through."

#: Revisions planted after head, in a copy of the scripts: each fails after it changed
#: the schema and the rows (on SQLite the rebuild of ``topics`` is the step that failed
#: before, with foreign keys on).
PLANTED_UPGRADES = {
    "raises": """
        with op.batch_alter_table("topics", recreate=REBUILD) as batch:
            batch.add_column(sa.Column("doomed", sa.Integer, nullable=False, server_default="7"))
        op.execute("UPDATE topic_partitions SET node_id = 99")
        op.execute("DELETE FROM transactions WHERE state = 'Dead'")
        op.create_table("doomed", sa.Column("id", sa.Integer, primary_key=True))
        op.execute("INSERT INTO doomed (id) VALUES (1)")
        raise RuntimeError("planted failure after altering topics")
    """,
    # a dangling reference: SQLite (foreign keys off) finds it in foreign_key_check,
    # PostgreSQL refuses the DELETE itself
    "dangling": """
        with op.batch_alter_table("topics", recreate=REBUILD) as batch:
            batch.add_column(sa.Column("doomed", sa.Integer, nullable=False, server_default="7"))
        op.execute("DELETE FROM topics WHERE name = 'payments'")
    """,
}


def planted_config(tmp_path: Path, body: str) -> Path:
    """A copy of ``migrations/`` with revision ``PLANTED`` after head, whose upgrade is
    ``body``; returns the copy's directory."""
    copy = tmp_path / "migrations"
    shutil.copytree(
        alembic_config().get_main_option("script_location") or "", copy,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    source = f'''"""{PLANTED_TITLE}

Revision ID: {PLANTED}
Revises: {HEAD}
"""

import sqlalchemy as sa
from alembic import op

revision = "{PLANTED}"
down_revision = "{HEAD}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite: rebuild the table (as 0004 does); PostgreSQL alters it in place
    REBUILD = "always" if op.get_bind().dialect.name == "sqlite" else "auto"
{textwrap.indent(textwrap.dedent(body).strip(), "    ")}


def downgrade() -> None:
    raise NotImplementedError
'''
    (copy / "versions" / f"{PLANTED}_planted.py").write_text(source)
    return copy


def config_of(directory: Path) -> Config:
    cfg = Config(str(directory / "alembic.ini"))
    cfg.set_main_option("script_location", str(directory))
    return cfg


def state(engine: sa.Engine) -> dict[str, Any]:
    """Everything a rolled-back upgrade must not have changed: every row of every table
    (Alembic's version included) and the schema, as the database itself describes it."""
    with engine.connect() as conn:
        meta = sa.MetaData()
        meta.reflect(conn)
        out: dict[str, Any] = {"rows": {t.name: _rows(conn, t) for t in meta.sorted_tables}}
        if engine.dialect.name == "sqlite":
            out["schema"] = conn.exec_driver_sql(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
            ).all()
        else:
            out["columns"] = conn.exec_driver_sql(
                "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
                " column_default FROM information_schema.columns WHERE table_schema = 'public'"
                " ORDER BY table_name, ordinal_position"
            ).all()
            out["constraints"] = conn.exec_driver_sql(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                " FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
            ).all()
            out["indexes"] = conn.exec_driver_sql(
                "SELECT tablename, indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'public' ORDER BY 1, 2"
            ).all()
        return out


def sqlite_files(url: str) -> dict[str, bytes]:
    """The database's files (with every connection closed: no WAL left over)."""
    path = Path(url.split("///", 1)[1])
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(f"{path.name}*"))}


@pytest.mark.parametrize(("planted", "start"), [("raises", "0003"), ("dangling", "0005")])
def test_a_failing_migration_changes_nothing_and_names_itself(
    url: str, tmp_path: Path, planted: str, start: str
) -> None:
    scripts = planted_config(tmp_path, PLANTED_UPGRADES[planted])
    engine, _ = prepare(url, start)
    try:
        before = state(engine)
        engine.dispose()  # closes the file: its bytes are the database, all of it
        files = sqlite_files(url) if engine.dialect.name == "sqlite" else {}
        with pytest.raises(MigrationError) as failed:
            upgrade(engine, config=config_of(scripts))
        error = failed.value
        assert (error.revision, error.current, error.target) == (PLANTED, start, "head")
        message = str(error)
        assert f"migration {PLANTED} ({PLANTED_TITLE}) failed" in message
        assert f"still at revision {start}" in message
        if planted == "raises":
            assert "RuntimeError: planted failure after altering topics" in message
        elif engine.dialect.name == "sqlite":
            assert "foreign_key_check: topic_partitions row" in message
            assert "missing topics row" in message
        else:
            assert "ForeignKeyViolation" in message
        assert version(engine) == start
        assert state(engine) == before
        check_foreign_keys_enforced(engine)
        engine.dispose()
        if engine.dialect.name == "sqlite":
            assert sqlite_files(url) == files
        upgrade(engine)  # the real migrations still apply on what was left
        assert version(engine) == HEAD
    finally:
        engine.dispose()


def test_eos_db_upgrade_reports_the_failed_revision(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``eos db upgrade`` prints what failed, with no traceback, and exits non-zero."""
    scripts = planted_config(tmp_path, PLANTED_UPGRADES["raises"])
    engine, before = prepare(url, "0004")
    engine.dispose()
    monkeypatch.setattr(migrate, "MIGRATIONS_DIR", scripts)
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 1, result.output
    assert f"migration {PLANTED} ({PLANTED_TITLE}) failed" in result.stderr
    assert "still at revision 0004" in result.stderr
    assert "planted failure after altering topics" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""
    try:
        assert version(engine) == "0004"
        assert snapshot(engine) == before
    finally:
        engine.dispose()


def test_a_coordinator_starts_on_the_data_of_an_older_release(
    coordinator_factory: CoordinatorFactory, tmp_path: Path
) -> None:
    """The defect as a user met it: the SQLite database of a release from before
    replication (0003), with topics, partitions and transactions in it, and the current
    release started on the same data dir."""
    data_dir = tmp_path / "coord"
    engine, _ = prepare(f"sqlite:///{data_dir / 'coordinator.db'}", "0003")
    engine.dispose()
    coordinator = coordinator_factory(database_url=None, data_dir=data_dir, background=False)
    assert coordinator.services.db.dialect == "sqlite"
    with coordinator.client() as c:
        answer = c.get("/v1/transactions/t-ongoing")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["state"] == "Ongoing"
        assert [(p["topic"], p["partition"]) for p in body["partitions"]] == [
            ("orders", 0), ("payments", 0)
        ]
    engine = make_engine(coordinator.settings.effective_database_url, pool_size=1)
    try:
        assert version(engine) == HEAD
    finally:
        engine.dispose()
