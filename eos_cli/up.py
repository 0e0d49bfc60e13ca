"""``eos up``: a whole cluster on loopback ports, in the foreground.

One coordinator (or several, on PostgreSQL) and M storage nodes run as child processes,
each with its own data directory under ``--data-dir`` and its log file beside it. The
cluster's internal token is made once and kept in the data directory, so a restart of
``eos up`` finds the same cluster: same data, same token, same ports. With ``--auth`` it
also makes a tokens file and a super user's token there.

Every node is given every coordinator's URL, so a node can still verify transactional
batches while one coordinator is down. Once the cluster is ready, ``eos up`` supervises
it (``eos_cli.supervisor``): a service that dies is reported on stderr and restarted
with a growing delay while the others keep running. Ctrl-C or SIGTERM stops every child
cleanly (SIGTERM, then SIGKILL for any that hangs).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.markup import escape

from eos_cli.supervisor import Service, Supervisor
from eos_security.tokens import new_token, token_entry

console = Console(stderr=True)
ADMIN = "User:admin"


@dataclass
class ClusterPlan:
    data_dir: Path
    nodes: int = 3
    coordinators: int = 1
    port_base: int = 8080
    host: str = "127.0.0.1"
    database_url: str | None = None
    log_level: str = "warning"
    auth: bool = False

    def __post_init__(self) -> None:
        if self.coordinators > 1 and not self.database_url:
            raise ValueError("several coordinators need a shared PostgreSQL --database-url")
        self.data_dir = self.data_dir.resolve()

    @property
    def coordinator_urls(self) -> list[str]:
        return [f"http://{self.host}:{self.port_base + i}" for i in range(self.coordinators)]

    @property
    def bootstrap_list(self) -> str:
        """Every coordinator, comma-separated: what nodes and clients are given, so that
        any one coordinator being down is not an outage for them."""
        return ",".join(self.coordinator_urls)

    @property
    def node_urls(self) -> dict[int, str]:
        return {
            n: f"http://{self.host}:{self.port_base + 10 + n}" for n in range(1, self.nodes + 1)
        }

    def internal_token(self) -> str:
        """The cluster's internal token, made on first start and kept with the data."""
        path = self.data_dir / "internal-token"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text().strip()

    def admin_token(self) -> str:
        """With ``auth``: the super user's token, made on first start with the tokens file
        (which holds only its hash) and kept beside the internal token, as a local
        cluster's operator needs it again after a restart."""
        path = self.data_dir / "admin-token"
        tokens = self.data_dir / "tokens.toml"
        if not path.exists() or not tokens.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            token = new_token()
            tokens.write_text(token_entry(ADMIN, token))
            path.write_text(token)
            path.chmod(0o600)
        return path.read_text().strip()

    def service(self, name: str, url: str, argv: list[str]) -> Service:
        slug = name.replace(" ", "-")
        return Service(
            name,
            url,
            argv,
            log_path=self.data_dir / "logs" / f"{slug}.log",
            pid_path=self.data_dir / "run" / f"{slug}.pid",
        )

    def build(self) -> list[Service]:
        python = sys.executable
        nodes_spec = ",".join(f"{n}={url}" for n, url in self.node_urls.items())
        children: list[Service] = []
        for n, url in self.node_urls.items():
            argv = [
                python,
                "-m",
                "partition_service",
                "--node-id",
                str(n),
                "--host",
                self.host,
                "--port",
                url.rsplit(":", 1)[1],
                "--data-dir",
                str(self.data_dir / f"node-{n}"),
                "--coordinator-url",
                self.bootstrap_list,
                "--log-level",
                self.log_level,
            ]
            children.append(self.service(f"node {n}", url, argv))
        for i, url in enumerate(self.coordinator_urls):
            argv = [
                python,
                "-m",
                "coordinator_service",
                "--host",
                self.host,
                "--port",
                url.rsplit(":", 1)[1],
                "--nodes",
                nodes_spec,
                "--public-url",
                url,
                "--data-dir",
                str(self.data_dir / "coordinator"),
                "--log-level",
                self.log_level,
            ]
            if self.database_url:
                argv += ["--database-url", self.database_url]
            children.append(self.service(f"coordinator {i + 1}", url, argv))
        return children

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["EOS_INTERNAL_TOKEN"] = self.internal_token()
        if self.auth:
            self.admin_token()
            env["EOS_AUTH_TOKENS_FILE"] = str(self.data_dir / "tokens.toml")
            env["EOS_SUPER_USERS"] = ADMIN
        return env


class Cluster:
    """The plan's services under a supervisor: started together, kept running, stopped
    in reverse order."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.children = plan.build()
        self.supervisor = Supervisor(self.children, plan.environment())

    def start(self, timeout: float = 120.0, stopping: Callable[[], bool] = lambda: False) -> None:
        self.supervisor.start(timeout, stopping)

    def supervise(self, stopping: Callable[[], bool]) -> None:
        self.supervisor.run(stopping)

    def stop(self) -> None:
        self.supervisor.stop()

    @property
    def bootstrap_url(self) -> str:
        """One coordinator: enough for a client that only takes one URL."""
        return self.plan.coordinator_urls[0]


def run_up(plan: ClusterPlan) -> int:
    """Run the cluster until Ctrl-C / SIGTERM; returns the exit code (1 if the first start
    failed; deaths after that are restarted, not fatal)."""
    stopping = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = Cluster(plan)
    try:
        cluster.start(stopping=stopping.is_set)
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        cluster.stop()
        return 1
    if not stopping.is_set():
        for child in cluster.children:
            print(f"{child.name:<14} {child.url}", flush=True)
        if plan.auth:
            print(f"auth on: export EOS_TOKEN=$(cat {plan.data_dir / 'admin-token'})  "
                  f"({ADMIN}, a super user; eos auth new-token adds others)", flush=True)
        print(f"pids in {plan.data_dir / 'run'}; a service that dies is restarted", flush=True)
        print(
            f"cluster ready: bootstrap {plan.bootstrap_list}  (data in {plan.data_dir})",
            flush=True,
        )
        cluster.supervise(stopping.is_set)
    cluster.stop()
    print("cluster stopped", flush=True)
    return 0
