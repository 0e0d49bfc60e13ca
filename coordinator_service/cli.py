"""Command-line entry points of the coordinator (``eos coordinator``, ``eos db upgrade``).

The flags of ``eos coordinator`` are generated from ``CoordinatorSettings``
(eos_server/settings_cli.py, as the node's are from its settings), so every setting is a
flag (``--lease-ms``) as well as an environment variable (``EOS_LEASE_MS``) and the two
lists cannot drift apart. A flag given on the command line wins over the environment; one
left out falls back to it, then to the default.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import typer

from coordinator_service.settings import CoordinatorSettings
from eos_server.process import serve
from eos_server.settings_cli import setting_option, settings_from_flags, with_settings_flags

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger("eos.coordinator")


def run_coordinator(settings: CoordinatorSettings) -> None:
    """Serve one instance; with ``instances`` above 1, run and supervise that many."""
    if settings.instances > 1:
        from eos_cli.coordinator_group import run_group

        raise SystemExit(run_group(settings))
    serve(
        "coordinator",
        lambda: build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_format=settings.log_format,
        graceful_shutdown_s=5,
        tls_cert=str(settings.tls_cert) if settings.tls_cert else None,
        tls_key=str(settings.tls_key) if settings.tls_key else None,
    )


def build_app(settings: CoordinatorSettings) -> FastAPI:
    """The app, once the database accepts connections (logging is set up by then)."""
    from coordinator_service.app import create_app
    from coordinator_service.db.startup import DatabaseUnreachable, wait_for_database

    try:
        wait_for_database(settings.effective_database_url, settings.database_wait_ms)
    except DatabaseUnreachable as exc:
        log.error("coordinator cannot start: %s", exc)
        raise SystemExit(1) from None
    return create_app(settings)


@with_settings_flags(CoordinatorSettings)
def coordinator(**flags: Any) -> None:
    """Run a transaction coordinator (FastAPI under uvicorn); with --instances K, K of
    them on consecutive ports, supervised by this process."""
    run_coordinator(settings_from_flags(CoordinatorSettings, flags))


db_app = typer.Typer(help="The coordinator's database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    database_url: str | None = setting_option(CoordinatorSettings, "database_url"),
    data_dir: str | None = setting_option(CoordinatorSettings, "data_dir"),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to reach."),
) -> None:
    """Apply the Alembic migrations (``alembic upgrade head``)."""
    from coordinator_service.db.engine import MigrationError, make_engine, upgrade

    settings = settings_from_flags(
        CoordinatorSettings, {"database_url": database_url, "data_dir": data_dir}
    )
    engine = make_engine(settings.effective_database_url, pool_size=1)
    try:
        upgrade(engine, revision)
    except MigrationError as exc:
        # An operator's answer, not a traceback: which revision failed, why, and that the
        # database was left as it was (the upgrade is one transaction).
        typer.echo(f"eos db upgrade: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    typer.echo(f"database at revision {revision}")


def register(app: typer.Typer) -> None:
    """Add the coordinator's commands to the ``eos`` application."""
    app.command("coordinator")(coordinator)
    app.add_typer(db_app, name="db")


def standalone() -> typer.Typer:
    """The CLI of ``python -m coordinator_service`` (the ``coordinator`` command alone)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(coordinator)
    return app
