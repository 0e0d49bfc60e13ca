"""``eos coordinator --instances K``: K coordinator processes from one command.

One coordinator is one Python process, and a Python process uses about one core; the
transaction-log partitions are shared evenly between the live instances
(``coordinator_service/cluster/lease_balance.py``), so K instances on one database use K cores.
This runs them as children on consecutive ports from ``--port`` and keeps them running
as ``eos up`` keeps its services (``eos_cli.supervisor``): a child that dies is reported
and started again after a growing delay, while the others carry its partitions; Ctrl-C
or SIGTERM stops them all, each releasing its leases on the way out.

Each child gets the settings this command was given, except those that must differ per
instance: its port (``--port`` + i), its ``--instance-id`` (this command's, given or
random, suffixed ``-i``), and its ``--public-url`` (the one given with the port raised
by i, when it names one). Settings from ``EOS_*`` variables reach the children through
the environment. Their logs go to ``<data-dir>/coordinator-<i>.log``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from coordinator_service.settings import CoordinatorSettings
from eos_cli.launcher import ServiceProcess
from eos_cli.supervisor import Supervisor, stop_on_signals
from eos_server.settings_cli import setting_flags

#: Settings each child gets its own value of, not the command's.
PER_INSTANCE = frozenset({"instances", "port", "instance_id", "public_url"})


class GroupError(ValueError):
    """The settings cannot run several instances (said before anything starts)."""


def shifted_url(url: str, by: int) -> str:
    """``url`` with its port raised by ``by`` (the scheme's default port when none)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port + by}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def child_args(settings: CoordinatorSettings, i: int) -> list[str]:
    """The command line of instance ``i``: every setting given to this command (by flag
    or variable), then its own."""
    args: list[str] = []
    for flag in setting_flags(CoordinatorSettings):
        if flag.field not in settings.model_fields_set or flag.field in PER_INSTANCE:
            continue
        value = getattr(settings, flag.field)
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(flag.flag if value else str(flag.negative))
        else:
            args += [flag.flag, str(value)]
    args += ["--instances", "1", "--port", str(settings.port + i)]
    # always given, so an EOS_INSTANCE_ID the children inherit cannot name them all
    args += ["--instance-id", f"{settings.instance_id}-{i}"]
    if settings.public_url:
        args += ["--public-url", shifted_url(settings.public_url, i)]
    return args


def plan_children(settings: CoordinatorSettings) -> list[ServiceProcess]:
    """The K children, or ``GroupError`` for settings several instances cannot share."""
    if not settings.database_url or settings.database_url.startswith("sqlite"):
        raise GroupError(
            "--instances above 1 needs a shared PostgreSQL --database-url "
            "(SQLite serves one instance)"
        )
    if settings.port == 0:
        raise GroupError("--instances above 1 needs a fixed --port (instances use port + i)")
    if settings.port + settings.instances - 1 > 65535:
        raise GroupError(f"ports {settings.port}..{settings.port + settings.instances - 1} "
                         "do not all exist")
    log_dir = Path(settings.data_dir)
    probe_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return [
        ServiceProcess.python_module(
            f"coordinator-{i}",
            "coordinator_service",
            child_args(settings, i),
            port=settings.port + i,
            host=probe_host,
            scheme=settings.scheme,
            verify=False,  # the readiness probe only; clients verify as configured
            log_path=log_dir / f"coordinator-{i}.log",
        )
        for i in range(settings.instances)
    ]


def run_group(settings: CoordinatorSettings) -> int:
    """Run the instances until Ctrl-C / SIGTERM; the exit status (2: settings that cannot
    run several instances, 1: the first start failed)."""
    try:
        children = plan_children(settings)
    except GroupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stopping = stop_on_signals()
    supervisor = Supervisor(children)
    try:
        supervisor.start(timeout=120, stopping=stopping.is_set)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        supervisor.stop()
        return 1
    for child in children:
        print(f"{child.name:<14} {child.url}  (log {child.log_path})", flush=True)
    print(f"{len(children)} coordinator instances ready", flush=True)
    supervisor.run(stopping.is_set)
    supervisor.stop()
    print("coordinator instances stopped", flush=True)
    return 0
