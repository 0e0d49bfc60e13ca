"""``eos node`` and ``python -m partition_service``: run a storage node.

The flags are generated from ``NodeSettings`` (eos_server/settings_cli.py), as the
coordinator's are from its settings: every setting is a flag (``--segment-bytes``) and an
environment variable (``EOS_SEGMENT_BYTES``). A flag given wins over the environment; one
left out falls back to it, then to the default.
"""

from __future__ import annotations

from typing import Any

import typer

from eos_server.process import serve
from eos_server.settings_cli import settings_from_flags, with_settings_flags
from partition_service.settings import NodeSettings


def run_node(settings: NodeSettings) -> None:
    from partition_service.app import create_app

    serve(
        "node",
        lambda: create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_format=settings.log_format,
        graceful_shutdown_s=10,
        tls_cert=str(settings.tls_cert) if settings.tls_cert else None,
        tls_key=str(settings.tls_key) if settings.tls_key else None,
    )


@with_settings_flags(NodeSettings)
def node(**flags: Any) -> None:
    """Run a storage node: partition logs with idempotent and transactional writes."""
    run_node(settings_from_flags(NodeSettings, flags))


def register(app: typer.Typer) -> None:
    """Add ``node`` to the ``eos`` application (or, alone, to ``python -m partition_service``)."""
    app.command("node")(node)
