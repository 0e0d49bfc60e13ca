"""``eos transactions hanging`` and ``eos transactions abort-hanging`` (KIP-664's
find-hanging and abort), on the ``transactions`` group of the everyday commands.

A module of their own so the everyday commands stay one screenful each; they talk to the
cluster through the SDK's admin client like every other command.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from eos_cli.commands import DEFAULT_BOOTSTRAP, Bootstrap, out, reports_errors, transactions
from sdk import AdminClient


@reports_errors
def transactions_hanging(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the API's answer as JSON.")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Transactions open on a partition that the coordinators cannot end (hanging)."""
    with AdminClient(bootstrap) as admin:
        found = admin.list_hanging_transactions()
    if as_json:
        print(json.dumps(found.model_dump(mode="json"), indent=2))
        return
    table = Table(
        "topic", "partition", "producer id", "epoch", "first offset", "age ms", "reason",
        "transactional id", "coordinator state",
    )  # fmt: skip
    for h in found.hanging:
        table.add_row(
            h.topic, str(h.partition), str(h.producer_id), str(h.producer_epoch),
            str(h.first_offset), str(h.age_ms), h.reason.value, h.transactional_id or "",
            h.coordinator_state or "",
        )  # fmt: skip
    out.print(table)
    out.print(f"{len(found.hanging)} hanging of {found.open_on_nodes} open on the nodes")


@reports_errors
def transactions_abort_hanging(
    topic: Annotated[str, typer.Option("--topic", help="The partition's topic.")],
    partition: Annotated[int, typer.Option("--partition", min=0)],
    producer_id: Annotated[int, typer.Option("--producer-id", min=0)],
    producer_epoch: Annotated[int, typer.Option("--producer-epoch", min=0)],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Abort one hanging transaction on one partition (abort marker, bumped epoch)."""
    with AdminClient(bootstrap) as admin:
        done = admin.abort_hanging_transaction((topic, partition), producer_id, producer_epoch)
    out.print(
        f"aborted producer {done.producer_id} epoch {done.producer_epoch} on "
        f"{done.topic}/{done.partition} from offset {done.first_offset} "
        f"(marker epoch {done.marker_epoch}, node {done.leader})",
        highlight=False,
    )


def register(_app: typer.Typer) -> None:
    """Add both commands to the ``transactions`` group (``eos_cli.commands`` puts the
    group on the application)."""
    transactions.command("hanging")(transactions_hanging)
    transactions.command("abort-hanging")(transactions_abort_hanging)
