"""``eos``: one command line for running and operating the product.

Each service registers its own commands (``eos node``, ``eos coordinator``, ``eos db``), so
this module only assembles them.
"""

from __future__ import annotations

import typer

from coordinator_service.cli import register as register_coordinator
from eos_cli.bench_command import register as register_bench
from eos_cli.cluster_commands import register as register_cluster
from eos_cli.commands import register as register_everyday
from eos_cli.demo import register as register_demo
from eos_cli.openapi_command import register as register_openapi
from partition_service.cli import register as register_node
from spark_jobs.cli import register as register_spark

app = typer.Typer(
    name="eos",
    help="EOS: exactly-once transactions over HTTP.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
register_cluster(app)
register_demo(app)
register_everyday(app)
register_node(app)
register_coordinator(app)
register_spark(app)
register_bench(app)
register_openapi(app)


if __name__ == "__main__":  # pragma: no cover
    app()
