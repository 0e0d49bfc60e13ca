"""Schema migrations: ``alembic upgrade``, run so that it works on a database that holds
data and either applies every pending revision or none.

All pending revisions run in ONE transaction. SQLite and PostgreSQL both have
transactional DDL, so a revision that fails half-way (after it already rebuilt a table)
rolls back together with the revisions before it, and the database stays exactly at the
revision it was at; ``MigrationError`` then says which revision failed and why.

SQLite cannot alter most of a table in place: ``op.batch_alter_table`` makes a new copy,
fills it, drops the old table and renames the copy. The coordinator's engine turns
``PRAGMA foreign_keys`` on for every connection, and with it on, dropping ``topics`` while
``topic_partitions`` rows reference it fails (``FOREIGN KEY constraint failed``) even though
the copy about to take its name holds the same rows. So the migration's connection follows
the procedure of https://www.sqlite.org/lang_altertable.html: foreign keys off BEFORE the
transaction begins (inside one the pragma does nothing), the migrations, a
``PRAGMA foreign_key_check`` after each revision (so a revision that does leave a
dangling reference is named and the whole upgrade rolled back), commit, and foreign keys
on again on that connection before the pool hands it out (or, if that cannot be checked,
the connection is thrown away).

PostgreSQL enforces its foreign keys itself throughout; there, an advisory lock taken in
the migration's transaction lets one of several coordinators starting at once migrate
while the others wait, then find nothing left to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext, MigrationInfo
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent

#: The PostgreSQL advisory lock (transaction-scoped) that serialises concurrent migrations.
MIGRATION_LOCK = 4242

#: How many ``foreign_key_check`` rows a ``ForeignKeyViolation`` message lists.
_SHOWN_VIOLATIONS = 5


class MigrationError(Exception):
    """An upgrade failed and was rolled back: nothing of it was applied.

    ``revision`` is the revision whose upgrade failed (None when the failure was not in
    one, e.g. an unknown target or the commit itself), ``description`` its one-line
    description, ``current`` the revision the database was at and still is at (None: an
    empty database), ``target`` the revision asked for, ``cause`` the underlying error
    (also chained as ``__cause__``).
    """

    def __init__(
        self,
        *,
        revision: str | None,
        description: str,
        current: str | None,
        target: str,
        cause: BaseException,
    ) -> None:
        self.revision = revision
        self.description = description
        self.current = current
        self.target = target
        self.cause = cause
        super().__init__(self._message())

    def _message(self) -> str:
        at = self.current or "base (an empty database)"
        if self.revision is not None:
            what = f"migration {self.revision} ({self.description}) failed"
        else:
            what = f"the upgrade from {at} to {self.target} failed"
        return (
            f"{what}; the upgrade to {self.target} was rolled back and the database is "
            f"unchanged, still at revision {at}.\n"
            f"Cause: {type(self.cause).__name__}: {self.cause}"
        )


class ForeignKeyViolation(Exception):
    """``PRAGMA foreign_key_check`` found rows that reference no row (SQLite)."""


def alembic_config(url: str | None = None) -> Config:
    """The Alembic configuration of ``migrations/`` (``MIGRATIONS_DIR``)."""
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def describe(script: ScriptDirectory, revision: str) -> str:
    """A revision's one-line description: the first paragraph of its docstring on one line
    (several migrations wrap their title over two lines)."""
    try:
        doc = script.get_revision(revision)
    except Exception:  # a revision the scripts do not know: say so rather than fail again
        return "unknown revision"
    return " ".join(doc.doc.split()) if doc is not None and doc.doc else "no description"


def upgrade(engine: Engine, revision: str = "head", *, config: Config | None = None) -> None:
    """``alembic upgrade <revision>`` on ``engine``: the only way the schema is made or
    changed, from ``eos db upgrade`` and from the coordinator's start alike.

    ``config`` (default: ``alembic_config()``) names another script directory, for tools
    and tests. Raises ``MigrationError`` when a revision fails; the database is then left
    exactly as it was.
    """
    cfg = config if config is not None else alembic_config()
    script = ScriptDirectory.from_config(cfg)
    sqlite = engine.dialect.name == "sqlite"
    with _migration_connection(engine) as conn:
        transaction = conn.begin()  # SQLite: BEGIN IMMEDIATE (the engine's "begin" hook)
        try:
            if engine.dialect.name == "postgresql":
                # Several coordinators may start at once: let one migrate, the others wait.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            current = MigrationContext.configure(conn).get_current_revision()
        except BaseException:  # no migration ran yet: the error is the database's own
            transaction.rollback()
            raise
        applied: list[str] = []

        def after_step(*, step: MigrationInfo, **_: Any) -> None:
            # Alembic calls this after each revision's upgrade, in the transaction: a
            # dangling reference is blamed on the revision that made it.
            if sqlite:
                check_foreign_keys(conn)
            applied.extend(step.up_revision_ids)

        cfg.attributes["connection"] = conn
        cfg.attributes["on_version_apply"] = after_step
        try:
            command.upgrade(cfg, revision)
            if sqlite and applied:
                # the recipe's check before commit (each step was checked already); not
                # when nothing ran: a start with nothing to migrate changes nothing
                check_foreign_keys(conn)
            transaction.commit()
        except Exception as exc:
            if transaction.is_active:
                transaction.rollback()
            failed = _failed_revision(script, revision, current, applied)
            raise MigrationError(
                revision=failed,
                description=describe(script, failed) if failed is not None else "",
                current=current,
                target=revision,
                cause=exc,
            ) from exc
        except BaseException:  # interrupted: roll back, and let the interruption through
            if transaction.is_active:
                transaction.rollback()
            raise
        finally:
            cfg.attributes.pop("connection", None)
            cfg.attributes.pop("on_version_apply", None)


def check_foreign_keys(conn: Connection) -> None:
    """Raise ``ForeignKeyViolation`` if any row of the database references no row
    (``PRAGMA foreign_key_check``, SQLite; it reads inside the open transaction)."""
    rows = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if not rows:
        return
    shown = "; ".join(
        f"{table} row {rowid} references a missing {parent} row"
        for table, rowid, parent, _fkid in rows[:_SHOWN_VIOLATIONS]
    )
    more = len(rows) - _SHOWN_VIOLATIONS
    raise ForeignKeyViolation(
        f"PRAGMA foreign_key_check: {shown}" + (f" (and {more} more)" if more > 0 else "")
    )


@contextlib.contextmanager
def _migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection of ``engine`` to migrate on. On SQLite its foreign keys are off
    until it goes back to the pool: set on the driver's connection, outside any
    transaction (SQLAlchemy's own ``exec_driver_sql`` would first begin one, through the
    engine's ``BEGIN IMMEDIATE`` hook, and the pragma would do nothing)."""
    with engine.connect() as conn:
        if engine.dialect.name != "sqlite":
            yield conn
            return
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.execute("PRAGMA foreign_keys=OFF")
        if raw.execute("PRAGMA foreign_keys").fetchone() != (0,):
            conn.invalidate()
            raise RuntimeError("SQLite did not turn foreign keys off for the migration")
        try:
            yield conn
        finally:
            _restore_foreign_keys(conn)


def _restore_foreign_keys(conn: Connection) -> None:
    """Foreign keys on again on the migration's connection; if that cannot be confirmed
    (the connection broke, a transaction is somehow still open), the pool must not hand
    the connection out: it is discarded instead."""
    try:
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.execute("PRAGMA foreign_keys=ON")
        restored = raw.execute("PRAGMA foreign_keys").fetchone() == (1,)
    except Exception:
        restored = False
    if not restored:
        conn.invalidate()


def _failed_revision(
    script: ScriptDirectory, target: str, current: str | None, applied: list[str]
) -> str | None:
    """The revision that was running when the upgrade failed: the first pending one that
    was not applied. None when every pending one was (the failure came after them) or
    the pending ones cannot be told (an unknown target)."""
    try:
        pending = [
            s.revision for s in reversed(list(script.iterate_revisions(target, current or "base")))
        ]
    except Exception:  # e.g. a target that is no upgrade of ``current``: no step ran
        return None
    return next((rev for rev in pending if rev not in applied), None)
