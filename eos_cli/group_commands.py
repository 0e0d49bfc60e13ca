"""``eos groups``: list, describe, delete consumer groups and reset their offsets.

A module of its own so the everyday commands stay one screenful each. Like every other
command it talks to the cluster through the SDK's admin client, so deleting a group or
resetting its offsets reaches the group's coordinator wherever ``--bootstrap`` points.

Usage mistakes (no reset target or two, a datetime that does not parse) are refused
before anything is sent, with exit status 2 as for any other bad option; the cluster's
refusals (``NON_EMPTY_GROUP``, ``GROUP_ID_NOT_FOUND``) print their code and exit 1.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from eos_cli.commands import DEFAULT_BOOTSTRAP, Bootstrap, err, out, reports_errors
from eos_protocol.common import TopicPartition
from eos_protocol.groups import GroupDescription
from sdk import AdminClient

groups = typer.Typer(
    help="List, describe and delete consumer groups; reset their offsets.",
    no_args_is_help=True,
)

GroupArg = Annotated[str, typer.Argument(help="The consumer group id.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]


def _print_json(value: Any) -> None:
    # plain print: rich would wrap long lines and colour the text
    print(json.dumps(value, indent=2))


@groups.command("list")
@reports_errors
def groups_list(as_json: JsonOption = False, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Every consumer group on record: state, members, group epoch (ListGroups)."""
    with AdminClient(bootstrap) as admin:
        listed = admin.list_groups()
    if as_json:
        _print_json([g.model_dump(mode="json") for g in listed])
        return
    table = Table("group", "state", "members", "group epoch")
    for g in sorted(listed, key=lambda g: g.group_id):
        table.add_row(g.group_id, g.state, str(g.members), str(g.group_epoch))
    out.print(table)


@groups.command("describe")
@reports_errors
def groups_describe(
    group: GroupArg,
    no_lag: Annotated[
        bool, typer.Option("--no-lag", help="Leave out the lag (the nodes are not asked).")
    ] = False,
    as_json: JsonOption = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Members with their epochs and assignments, and each partition's lag against its
    last stable offset (what a read_committed member can reach)."""
    with AdminClient(bootstrap) as admin:
        described = admin.describe_group(group, lag=not no_lag)
    if as_json:
        _print_json(described.model_dump(mode="json"))
        return
    _print_description(described, lag=not no_lag)


def _print_description(group: GroupDescription, *, lag: bool) -> None:
    out.print(
        f"group {group.group_id}: {group.state}, group epoch {group.group_epoch}, "
        f"assignment epoch {group.assignment_epoch}, {len(group.members)} members",
        highlight=False,
    )
    # ids are printed whole, whatever the terminal's width: they are what a user copies
    members = Table(Column("member id", no_wrap=True, min_width=32), "instance id", "epoch",
                    "state", "assignment", title="members")  # fmt: skip
    for m in group.members:
        members.add_row(m.member_id, m.instance_id or "", str(m.member_epoch), m.state,
                        _partitions(m.assignment))  # fmt: skip
    out.print(members)
    if not lag:
        return
    table = Table("topic", "partition", "committed", "LSO", "lag",
                  Column("owner", no_wrap=True, min_width=32), title="lag")
    for row in sorted(group.lag, key=lambda r: (r.topic, r.partition)):
        table.add_row(row.topic, str(row.partition), _maybe(row.committed_offset),
                      _maybe(row.last_stable_offset), _maybe(row.lag), row.owner or "")  # fmt: skip
    out.print(table)
    known = [r.lag for r in group.lag if r.lag is not None]
    unknown = len(group.lag) - len(known)
    total = f"total lag {sum(known)}" + (f" ({unknown} partitions unknown)" if unknown else "")
    out.print(total, highlight=False)
    if group.lag_error:
        err.print(f"[yellow]lag unavailable[/yellow]: {group.lag_error}", highlight=False)


def _maybe(value: int | None) -> str:
    return "-" if value is None else str(value)


def _partitions(parts: list[TopicPartition]) -> str:
    """``orders:0,2 payments:1``: one word per topic keeps the column narrow."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in parts:
        by_topic[tp.topic].append(tp.partition)
    return " ".join(
        f"{topic}:{','.join(map(str, sorted(ps)))}" for topic, ps in sorted(by_topic.items())
    )


@groups.command("delete")
@reports_errors
def groups_delete(
    group: GroupArg,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete an empty group's state (refused while it has members). Its committed
    offsets stay on the storage nodes; reset them with eos groups reset."""
    with AdminClient(bootstrap) as admin:
        admin.delete_group(group)
    out.print(f"deleted group {group}", highlight=False)


@groups.command("reset")
@reports_errors
def groups_reset(
    group: GroupArg,
    topics: Annotated[
        list[str],
        typer.Option("--topic", "-t", help="A topic whose partitions all move (repeatable)."),
    ],
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="To each partition's log start.")
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="To each partition's last stable offset.")
    ] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime", metavar="ISO8601",
            help="To the first committed record at or after this time, e.g. "
            "2024-05-01T12:00:00Z (no zone: local time).",
        ),
    ] = None,
    to_timestamp_ms: Annotated[
        int | None,
        typer.Option("--to-timestamp-ms", min=0, help="As --to-datetime, in Unix ms."),
    ] = None,
    to_offset: Annotated[
        int | None,
        typer.Option("--to-offset", min=0, help="To this offset, clamped to each partition."),
    ] = None,
    as_json: JsonOption = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Move an empty group's committed offsets on every partition of the topics to
    exactly one target; refused while the group has members."""
    chosen = [name for name, given in (
        ("--to-earliest", to_earliest), ("--to-latest", to_latest),
        ("--to-datetime", to_datetime is not None),
        ("--to-timestamp-ms", to_timestamp_ms is not None),
        ("--to-offset", to_offset is not None),
    ) if given]  # fmt: skip
    if len(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-datetime, "
            f"--to-timestamp-ms, --to-offset (got {', '.join(chosen) or 'none'})"
        )
    if to_datetime is not None:
        to_timestamp_ms = parse_datetime_ms(to_datetime)
    with AdminClient(bootstrap) as admin:
        offsets = admin.reset_group_offsets(
            group, topics, to_earliest=to_earliest, to_latest=to_latest,
            to_timestamp_ms=to_timestamp_ms, to_offset=to_offset,
        )  # fmt: skip
    if as_json:
        _print_json([o.model_dump(mode="json") for o in offsets])
        return
    table = Table("topic", "partition", "new offset", title=f"group {group}: offsets reset")
    for o in sorted(offsets, key=lambda o: (o.topic, o.partition)):
        table.add_row(o.topic, str(o.partition), str(o.offset))
    out.print(table)


def parse_datetime_ms(text: str) -> int:
    """Unix milliseconds of an ISO 8601 time; one without a zone is local time, as
    Kafka's ``--to-datetime`` reads it. A usage error (exit 2) when it does not parse."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2024-05-01T12:00:00Z)",
            param_hint="--to-datetime",
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # the local zone
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise typer.BadParameter(f"{text!r} is before 1970", param_hint="--to-datetime")
    return ms


def register(app: typer.Typer) -> None:
    app.add_typer(groups, name="groups")
