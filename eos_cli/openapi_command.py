"""``eos openapi``: write a service's OpenAPI document (the committed ``docs/openapi/*.json``).

The document is built from the service's app without starting it: no database, no
partitions and no network are touched, so the output depends on the code alone.
"""

from __future__ import annotations

import json
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


class Service(StrEnum):
    COORDINATOR = "coordinator"
    NODE = "node"


#: The spec is built from an app that never serves; it still needs a valid internal token.
_SCRATCH_TOKEN = "openapi-scratch-token-" + "0" * 16


def build_spec(service: Service | str) -> dict[str, Any]:
    """The OpenAPI document ``service`` serves at ``/openapi.json``."""
    service = Service(service)
    with tempfile.TemporaryDirectory(prefix="eos-openapi-") as scratch:
        if service is Service.COORDINATOR:
            from coordinator_service.app import create_app as create_coordinator
            from coordinator_service.settings import CoordinatorSettings

            app = create_coordinator(
                CoordinatorSettings(data_dir=Path(scratch), internal_token=_SCRATCH_TOKEN)
            )
        else:
            from partition_service.app import create_app as create_node
            from partition_service.settings import NodeSettings

            app = create_node(NodeSettings(data_dir=Path(scratch), internal_token=_SCRATCH_TOKEN))
        return app.openapi()


def render_spec(service: Service | str) -> str:
    """The document as the committed file holds it: sorted keys, two-space indent."""
    return json.dumps(build_spec(service), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def register(app: typer.Typer) -> None:
    @app.command("openapi")
    def openapi(
        service: Annotated[
            Service, typer.Option("--service", help="Which service's document to write.")
        ],
        output: Annotated[
            Path | None,
            typer.Option("--output", "-o", help="File to write; standard output by default."),
        ] = None,
    ) -> None:
        """Write the OpenAPI document of the coordinator or the storage node."""
        text = render_spec(service)
        if output is None:
            typer.echo(text, nl=False)
            return
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)
