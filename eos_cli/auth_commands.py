"""``eos auth`` (client tokens) and ``eos acls`` (access control lists).

``eos auth new-token`` makes a token, appends its hash to a tokens file and prints the
token once: the file never holds it, so it cannot be shown again. ``eos acls`` lists, adds
and removes ACL bindings through the admin API, like ``kafka-acls``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from eos_cli.commands import DEFAULT_BOOTSTRAP, Bootstrap, out, reports_errors
from eos_protocol.acl import PRINCIPAL_RE, Operation, PatternType, Permission, ResourceType
from eos_security.tokens import TokenFileError, new_token, parse_tokens, token_entry
from sdk import AclBinding, AclFilter, AdminClient

auth = typer.Typer(help="Client tokens for --auth-tokens-file.", no_args_is_help=True)
acls = typer.Typer(help="List, add and remove ACL bindings.", no_args_is_help=True)


@auth.command("new-token")
def auth_new_token(
    principal: Annotated[str, typer.Option(help="Who the token stands for: User:name.")],
    tokens_file: Annotated[
        Path | None,
        typer.Option(help="Append the token's hash to this file (made if missing)."),
    ] = None,
) -> None:
    """Make a client token: print it once, and its tokens-file entry (hash only)."""
    if not PRINCIPAL_RE.fullmatch(principal) or principal.endswith(":*"):
        raise typer.BadParameter("expected User:name", param_hint="--principal")
    token = new_token()
    entry = token_entry(principal, token)
    if tokens_file is not None:
        existing = tokens_file.read_text(encoding="utf-8") if tokens_file.exists() else ""
        joined = existing + ("\n" if existing and not existing.endswith("\n") else "") + entry
        try:
            parse_tokens(joined, str(tokens_file))
        except TokenFileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--tokens-file") from None
        tokens_file.write_text(joined, encoding="utf-8")
        typer.echo(f"# added to {tokens_file} (the services re-read it within a second)",
                   err=True)
    else:
        typer.echo(entry, err=True)
    typer.echo(token)


ResourceOption = Annotated[ResourceType, typer.Option("--resource-type", "-t")]
NameOption = Annotated[str, typer.Option("--resource-name", "-n", help="Name, prefix or *.")]


@acls.command("list")
@reports_errors
def acls_list(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    principal: Annotated[str | None, typer.Option()] = None,
    resource_type: Annotated[ResourceType | None, typer.Option("--resource-type", "-t")] = None,
) -> None:
    """List the ACL bindings (needs describe on the cluster)."""
    with AdminClient(bootstrap) as admin:
        found = admin.list_acls(principal=principal, resource_type=resource_type)
    table = Table("principal", "permission", "operation", "resource", "name", "pattern")
    for b in found:
        table.add_row(
            b.principal, b.permission.value, b.operation.value, b.resource_type.value,
            b.resource_name, b.pattern_type.value,
        )
    out.print(table)


@acls.command("add")
@reports_errors
def acls_add(
    principal: Annotated[str, typer.Option(help="User:name, or User:* for everybody.")],
    operation: Annotated[list[Operation], typer.Option("--operation", "-o")],
    resource_type: ResourceOption,
    resource_name: NameOption,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    pattern: Annotated[PatternType, typer.Option()] = PatternType.LITERAL,
    deny: Annotated[bool, typer.Option("--deny", help="A DENY binding (wins).")] = False,
) -> None:
    """Add bindings: PRINCIPAL may (or, with --deny, may not) do each OPERATION."""
    permission = Permission.DENY if deny else Permission.ALLOW
    bindings = [
        AclBinding(
            principal=principal, resource_type=resource_type, resource_name=resource_name,
            pattern_type=pattern, operation=op, permission=permission,
        )
        for op in operation
    ]
    with AdminClient(bootstrap) as admin:
        admin.create_acls(bindings)
    out.print(f"{len(bindings)} binding(s) in place")


@acls.command("remove")
@reports_errors
def acls_remove(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    principal: Annotated[str | None, typer.Option()] = None,
    resource_type: Annotated[ResourceType | None, typer.Option("--resource-type", "-t")] = None,
    resource_name: Annotated[str | None, typer.Option("--resource-name", "-n")] = None,
    operation: Annotated[Operation | None, typer.Option("--operation", "-o")] = None,
) -> None:
    """Remove every binding matching all the given fields (at least one)."""
    if principal is resource_type is resource_name is operation is None:
        raise ValueError("name at least one of --principal, -t, -n, -o")
    wanted = AclFilter(
        principal=principal, resource_type=resource_type, resource_name=resource_name,
        operation=operation,
    )
    with AdminClient(bootstrap) as admin:
        deleted = admin.delete_acls([wanted])
    out.print(f"{len(deleted)} binding(s) removed")


def register(app: typer.Typer) -> None:
    app.add_typer(auth, name="auth")
    app.add_typer(acls, name="acls")
