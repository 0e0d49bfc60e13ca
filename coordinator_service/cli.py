"""Command-line entry points of the coordinator (``eos coordinator``, ``eos db upgrade``).

The flags of ``eos coordinator`` are generated from ``CoordinatorSettings``, so every
setting is a flag (``--lease-ms``) as well as an environment variable (``EOS_LEASE_MS``)
and the two lists cannot drift apart. A flag given on the command line wins over the
environment; one left out falls back to it, then to the default.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from coordinator_service.settings import CoordinatorSettings
from eos_server.process import serve, settings_or_exit


def _plain_type(annotation: Any) -> Any:
    for candidate in (str, int, bool, Path):
        if annotation is candidate or annotation == candidate | None:
            return candidate
    return str


def _settings_parameters() -> list[inspect.Parameter]:
    params: list[inspect.Parameter] = []
    for name, field in CoordinatorSettings.model_fields.items():
        kind = _plain_type(field.annotation)
        flag = "--" + name.replace("_", "-")
        decls = [f"{flag}/--no-{name.replace('_', '-')}"] if kind is bool else [flag]
        option = typer.Option(
            None, *decls, help=f"{field.description or name} [env: EOS_{name.upper()}]",
            show_default=False,
        )
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind | None
            )
        )
    return params


def settings_from_flags(flags: dict[str, Any]) -> CoordinatorSettings:
    """Settings from the environment, overridden by the flags that were given."""
    given = {k: v for k, v in flags.items() if v is not None}
    return settings_or_exit(CoordinatorSettings, **given)


def run_coordinator(settings: CoordinatorSettings) -> None:
    from coordinator_service.app import create_app

    serve(
        "coordinator",
        lambda: create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_format=settings.log_format,
        graceful_shutdown_s=5,
        tls_cert=str(settings.tls_cert) if settings.tls_cert else None,
        tls_key=str(settings.tls_key) if settings.tls_key else None,
    )


def coordinator(**flags: Any) -> None:
    """Run a transaction coordinator (FastAPI under uvicorn)."""
    run_coordinator(settings_from_flags(flags))


coordinator.__signature__ = inspect.Signature(_settings_parameters())  # type: ignore[attr-defined]

db_app = typer.Typer(help="The coordinator's database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    database_url: str | None = typer.Option(
        None, "--database-url", help="SQLAlchemy URL [env: EOS_DATABASE_URL]"
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="For the SQLite default."),
    revision: str = typer.Option("head", "--revision"),
) -> None:
    """Apply the Alembic migrations (``alembic upgrade head``)."""
    from coordinator_service.db.engine import make_engine, upgrade

    settings = settings_from_flags({"database_url": database_url, "data_dir": data_dir})
    engine = make_engine(settings.effective_database_url, pool_size=1)
    try:
        upgrade(engine, revision)
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
