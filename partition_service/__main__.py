"""``python -m partition_service``: the same as ``eos node``."""

import typer

from partition_service.cli import register

app = typer.Typer(add_completion=False)
register(app)  # a single command: typer runs it without a subcommand name

if __name__ == "__main__":
    app()
