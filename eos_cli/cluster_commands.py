"""``eos up``: run a whole local cluster in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eos_cli.up import ClusterPlan, run_up


def up(
    data_dir: Annotated[Path, typer.Option(envvar="EOS_DATA_DIR", help="Where data lives.")] = Path(
        "./data"
    ),
    nodes: Annotated[int, typer.Option(min=1, max=50, help="Storage nodes.")] = 3,
    coordinators: Annotated[
        int, typer.Option(min=1, max=10, help="Coordinators (more than one needs PostgreSQL).")
    ] = 1,
    port_base: Annotated[
        int,
        typer.Option(help="Coordinators listen from here, node N on port-base + 10 + N."),
    ] = 8080,
    database_url: Annotated[
        str | None,
        typer.Option(envvar="EOS_DATABASE_URL", help="PostgreSQL URL (default: SQLite)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Log level of the services.")] = "warning",
    auth: Annotated[
        bool, typer.Option("--auth", help="Authentication and ACLs on; a super user's token.")
    ] = False,
) -> None:
    """Start one coordinator and three storage nodes on loopback ports; Ctrl-C stops them."""
    try:
        plan = ClusterPlan(
            data_dir=data_dir,
            nodes=nodes,
            coordinators=coordinators,
            port_base=port_base,
            database_url=database_url,
            log_level=log_level,
            auth=auth,
            # Kafka's production advice (three copies), as far as there are nodes
            default_replication_factor=min(3, nodes),
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_up(plan))


def register(app: typer.Typer) -> None:
    app.command("up")(up)
