"""``eos``: one command line for running and operating the product.

Each service registers its own commands (``eos node``, ``eos coordinator``, ``eos db``), so
this module only assembles them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from coordinator_service.cli import register as register_coordinator
from eos_cli.auth_commands import register as register_auth
from eos_cli.bench_command import register as register_bench
from eos_cli.cluster_commands import register as register_cluster
from eos_cli.commands import register as register_everyday
from eos_cli.demo import register as register_demo
from eos_cli.group_commands import register as register_groups
from eos_cli.hanging_commands import register as register_hanging
from eos_cli.openapi_command import register as register_openapi
from partition_service.cli import register as register_node
from spark_jobs.cli import register as register_spark

app = typer.Typer(
    name="eos",
    help="EOS: exactly-once transactions over HTTP.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def credentials(
    token: Annotated[
        str | None,
        typer.Option(envvar="EOS_TOKEN", help="Bearer token for clusters with auth on.",
                     show_default=False),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(envvar="EOS_CA_FILE", help="CA bundle for https:// services."),
    ] = None,
) -> None:
    """EOS: exactly-once transactions over HTTP."""
    # Every SDK client of this process (and a Spark job's executors) reads these.
    if token:
        os.environ["EOS_TOKEN"] = token
    if ca_file:
        os.environ["EOS_CA_FILE"] = str(ca_file)


register_cluster(app)
register_auth(app)
register_demo(app)
register_everyday(app)
register_hanging(app)
register_groups(app)
register_node(app)
register_coordinator(app)
register_spark(app)
register_bench(app)
register_openapi(app)


if __name__ == "__main__":  # pragma: no cover
    app()
