"""Command-line entry points of the coordinator (``eos coordinator``, ``eos db``)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the coordinator's commands to the ``eos`` application."""
    _ = app
