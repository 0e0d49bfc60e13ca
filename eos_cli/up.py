"""``eos up``: a whole cluster on loopback ports, in the foreground.

One coordinator (or several, on PostgreSQL) and M storage nodes run as child processes,
each with its own data directory under ``--data-dir`` and its log file beside it. The
cluster's internal token is made once and kept in the data directory, so a restart of
``eos up`` finds the same cluster: same data, same token, same ports. With ``--auth`` it
also makes a tokens file and a super user's token there. Ctrl-C or SIGTERM
stops every child cleanly (SIGTERM, then SIGKILL for any that hangs).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console

from eos_security.tokens import new_token, token_entry

console = Console(stderr=True)
ADMIN = "User:admin"


@dataclass
class Child:
    name: str
    url: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches us; we stop the children
            )

    def ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode if self.process else '?'};"
                f" see {self.log_path}"
            )
        try:
            return httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.coordinators > 1 and not self.database_url:
            raise ValueError("several coordinators need a shared PostgreSQL --database-url")
        self.data_dir = self.data_dir.resolve()

    @property
    def coordinator_urls(self) -> list[str]:
        return [f"http://{self.host}:{self.port_base + i}" for i in range(self.coordinators)]

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

    def build(self) -> list[Child]:
        python = sys.executable
        nodes_spec = ",".join(f"{n}={url}" for n, url in self.node_urls.items())
        children: list[Child] = []
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
                self.coordinator_urls[0],
                "--log-level",
                self.log_level,
            ]
            children.append(Child(f"node {n}", url, argv, self.data_dir / "logs" / f"node-{n}.log"))
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
            children.append(
                Child(
                    f"coordinator {i + 1}",
                    url,
                    argv,
                    self.data_dir / "logs" / f"coordinator-{i + 1}.log",
                )
            )
        self.children = children
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
    """Starts the plan's children, waits for them all, and stops them in reverse order."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.children = plan.build()

    def start(self, timeout: float = 120.0) -> None:
        env = self.plan.environment()
        for child in self.children:
            child.start(env)
        deadline = time.monotonic() + timeout
        waiting = list(self.children)
        while waiting:
            waiting = [child for child in waiting if not child.ready()]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(child.name for child in waiting)
                raise RuntimeError(f"not ready after {timeout:.0f}s: {names}")
            if waiting:
                time.sleep(0.1)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()

    def failed(self) -> Child | None:
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                return child
        return None

    @property
    def bootstrap_url(self) -> str:
        return self.plan.coordinator_urls[0]


def run_up(plan: ClusterPlan) -> int:
    """Run the cluster until Ctrl-C / SIGTERM; returns the exit code."""
    cluster = Cluster(plan)
    stopping = {"now": False}

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {exc}")
        cluster.stop()
        return 1
    for child in cluster.children:
        print(f"{child.name:<14} {child.url}", flush=True)
    if plan.auth:
        print(f"auth on: export EOS_TOKEN=$(cat {plan.data_dir / 'admin-token'})  "
              f"({ADMIN}, a super user; eos auth new-token adds others)", flush=True)
    print(
        f"cluster ready: bootstrap {cluster.bootstrap_url}  (data in {plan.data_dir})", flush=True
    )
    code = 0
    while not stopping["now"]:
        dead = cluster.failed()
        if dead is not None:
            console.print(f"[red]error:[/red] {dead.name} exited; see {dead.log_path}")
            code = 1
            break
        time.sleep(0.2)
    cluster.stop()
    print("cluster stopped", flush=True)
    return code
