"""Local EOS services as child processes: the one launcher behind ``eos up``, the benchmarks
and the tests.

Every way of running a cluster on one machine needs the same things: a port for each
service that stays its own across restarts (a restarted node must come back at the
address the coordinators know), the flags that tie the services together (the node list,
the coordinators a node verifies transactional batches with, the internal token, the
number of group-offset partitions, the TLS and authentication files), a log file per
service, a wait on ``/readyz``, and the signals a crash test sends. They are written once
here, so that what ``eos up`` starts is what the tests and the benchmarks measure.

* ``ServiceProcess``: one child process, its log file and optional pid file, ready when
  ``/readyz`` answers 200; ``kill`` (SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT),
  ``stop`` (SIGTERM, then SIGKILL if it hangs).
* ``ClusterPlan``: how many nodes and coordinators, where they listen (fixed from a port
  base, as ``eos up`` does, or on free ports), what database the coordinators share, and
  the options of each kind of service; it builds the ``ServiceProcess`` of each.
* ``LocalCluster``: a plan's services started one after the other and stopped in two
  waves (``stop_in_waves``: the coordinators, then every node at once), for a test or a
  benchmark that kills, pauses and restarts single services. ``eos up`` runs the same
  services under its supervisor instead (``eos_cli.supervisor``).

The internal token and the authentication settings travel in the environment, not on
the command line, so that ``ps`` shows no secret.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from eos_security.tokens import new_token, token_entry
from eos_server.parent_watch import PARENT_PID_ENV

ADMIN = "User:admin"


#: ``LO-HI``: where ``free_port`` picks. Processes that start services side by side (the
#: test suite's workers) give each its own slice: a port is free when it is picked, not
#: when the service binds it, and a killed service comes back on its own port, which
#: meanwhile looked free to everybody else.
PORT_RANGE_ENV = "EOS_PORT_RANGE"
DEFAULT_PORT_RANGE = (12_000, 32_000)


def port_range() -> tuple[int, int]:
    """The range of ``EOS_PORT_RANGE`` when it is a valid one, else 12000-32000."""
    try:
        low, high = (int(part) for part in os.environ.get(PORT_RANGE_ENV, "").split("-"))
    except ValueError:
        return DEFAULT_PORT_RANGE
    return (low, high) if 1024 <= low < high <= 65_536 else DEFAULT_PORT_RANGE


#: Ports this process handed out lately, not handed out again: a plan's services get their
#: ports before any binds, and a coordinator was once given its own node's port.
_RECENT_PORTS: deque[int] = deque(maxlen=2048)


def free_port() -> int:
    """A free loopback port in ``port_range()``, by default below 32000, outside the
    kernel's ephemeral range (32768 and up): a port from that range may be taken as the
    source port of some outgoing connection while the service that owned it is down, and
    a killed service must come back on its own port."""
    rng = random.SystemRandom()
    low, high = port_range()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port in _RECENT_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _RECENT_PORTS.append(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high}")


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``: Popen reports a death by
    signal as the negated signal number, which means little to a reader."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class ServiceError(RuntimeError):
    """A service exited while starting, or was not ready in time."""


class ChildProcess(Protocol):
    """What ``ServiceProcess`` asks of its process: the part of ``subprocess.Popen`` it
    uses, so that a spawner may hand back another kind."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


#: Spawners tried before ``subprocess.Popen``: ``(argv, env, log_path, own_session)`` → the
#: process, or None to pass. Empty by default; the test suite puts one here that forks its
#: hundreds of services from a process that imported them once (``tests/support/zygote.py``).
Spawner = Callable[[list[str], dict[str, str], Path, bool], ChildProcess | None]
SPAWNER: list[Spawner] = []


class ServiceProcess:
    """One child process with its log in a file, ready when ``ready_path`` answers 200."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        port: int,
        log_path: Path,
        host: str = "127.0.0.1",
        scheme: str = "http",
        verify: ssl.SSLContext | bool = True,
        env: Mapping[str, str] | None = None,
        pid_path: Path | None = None,
        own_session: bool = False,
        ready_path: str = "/readyz",
        data_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.host = host
        self.scheme = scheme  # "https" for a service given --tls-cert/--tls-key
        self.verify = verify  # what the readiness probe verifies an https service against
        self.env = dict(os.environ if env is None else env)
        self.pid_path = pid_path
        self.own_session = own_session  # Ctrl-C at a terminal reaches only the parent
        self.ready_path = ready_path
        self.data_dir = data_dir  # where the service keeps its data, when it has a place
        self.process: ChildProcess | None = None

    @classmethod
    def python_module(cls, name: str, module: str, args: list[str], **kw: Any) -> ServiceProcess:
        """``python -m <module> <args>`` with this interpreter."""
        return cls(name, [sys.executable, "-m", module, *args], **kw)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def launch(self, env: Mapping[str, str] | None = None) -> None:
        """Start the process without waiting for it (``env`` replaces the service's own)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # the service stops if this process dies without stopping it
        environment = {**(self.env if env is None else env), PARENT_PID_ENV: str(os.getpid())}
        self.process = None
        for spawn in SPAWNER:
            self.process = spawn(self.argv, environment, self.log_path, self.own_session)
            if self.process is not None:
                break
        if self.process is None:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, env=environment,
                    start_new_session=self.own_session,
                )  # fmt: skip
        if self.pid_path is not None:
            self.pid_path.parent.mkdir(parents=True, exist_ok=True)
            self.pid_path.write_text(f"{self.process.pid}\n")

    def start(self, timeout: float = 30.0) -> ServiceProcess:
        """Start the process and wait until it is ready. One that does not become ready
        is stopped (and reaped) before the error is raised: a failed start leaves no
        process behind holding its port."""
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop(timeout=5.0)
            raise
        return self

    def exit_code(self) -> int | None:
        """The exit code once the process has ended (reaping it), else None."""
        return self.process.poll() if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self, client: httpx.Client | None = None) -> bool:
        """``ready_path`` answers 200; False while it cannot be reached or is loading.
        A poller passes its ``client``: each new one loads a CA bundle (tens of ms)."""
        try:
            if client is not None:
                answer = client.get(self.url + self.ready_path)
            else:
                answer = httpx.get(self.url + self.ready_path, timeout=1.0, verify=self.verify)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def wait_ready(
        self, timeout: float = 30.0, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        """Poll until ready; ``ServiceError`` (with the log's tail) if the process exits
        or the deadline passes. Returns early once ``stopping`` turns true."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0, verify=self.verify) as client:
            while not stopping():
                code = self.exit_code()
                if code is not None:
                    raise ServiceError(
                        f"{self.name} {describe_exit(code)} while starting; see "
                        f"{self.log_path}:\n{self.tail()}"
                    )
                if self.ready(client):
                    return
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"{self.name} not ready after {timeout:.0f}s:\n{self.tail()}"
                    )
                time.sleep(0.05)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint, no goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.forget_pid()

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait for a clean exit; SIGKILL if it has not exited in ``timeout``
        (a paused process is resumed first, or it could not act on SIGTERM)."""
        self.ask_to_stop()
        self.wait_stopped(time.monotonic() + timeout)

    def ask_to_stop(self) -> None:
        """SIGTERM (after SIGCONT: a paused process could not act on it), not waiting."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()

    def wait_stopped(self, deadline: float) -> None:
        """Wait for the exit ``ask_to_stop`` asked for until ``deadline`` (monotonic), then
        SIGKILL."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.forget_pid()

    def forget_pid(self) -> None:
        if self.pid_path is not None:
            self.pid_path.unlink(missing_ok=True)


def stop_in_waves(services: Sequence[ServiceProcess], timeout: float = 15.0) -> None:
    """Stop ``services`` in two waves, each all at once: the coordinators (they write
    markers to the nodes), then the nodes. One after the other, a cluster of three nodes
    took the sum of their shutdowns, each flushing and closing thousands of partitions."""
    coordinators = [s for s in services if s.name.startswith("coordinator")]
    rest = [s for s in services if s not in coordinators]
    for wave in (coordinators, rest):
        for service in wave:
            service.ask_to_stop()
        deadline = time.monotonic() + timeout
        for service in wave:
            service.wait_stopped(deadline)


def node_args(
    node_id: int,
    port: int,
    data_dir: Path,
    *,
    coordinators: str = "",
    host: str = "127.0.0.1",
    log_level: str = "warning",
) -> list[str]:
    """The flags of ``python -m partition_service`` that place a node: it verifies
    transactional batches with ``coordinators`` (comma-separated URLs), or not at all."""
    args = ["--node-id", str(node_id), "--host", host, "--port", str(port),
            "--data-dir", str(data_dir), "--log-level", log_level]  # fmt: skip
    if coordinators:
        return [*args, "--coordinator-url", coordinators]
    return [*args, "--txn-verification", "off"]


def coordinator_args(
    port: int,
    nodes: str,
    *,
    data_dir: Path | None = None,
    database_url: str | None = None,
    public_url: str | None = None,
    host: str = "127.0.0.1",
    log_level: str = "warning",
) -> list[str]:
    """The flags of ``python -m coordinator_service`` that place a coordinator: its
    storage nodes (``1=http://...,2=...``) and its database (PostgreSQL at
    ``database_url``, else SQLite in ``data_dir``)."""
    args = ["--host", host, "--port", str(port), "--nodes", nodes, "--log-level", log_level,
            "--public-url", public_url or f"http://{host}:{port}"]  # fmt: skip
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    if database_url:
        args += ["--database-url", database_url]
    return args


@dataclass(frozen=True)
class TlsFiles:
    """A certificate and key every service serves HTTPS with, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path

    def flags(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key),
                "--tls-ca-file", str(self.ca)]  # fmt: skip

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@dataclass
class ClusterPlan:
    """What a local cluster is made of, where each service listens and what ties them.

    Coordinators listen from ``port_base`` and node N on ``port_base + 10 + N`` (what
    ``eos up`` prints and a restart finds again); with ``port_base=None`` each service gets
    a free port instead, fixed for the plan's life. Each service has its data directory
    under ``data_dir`` (``node-N``, ``coordinator`` for SQLite), its log in ``logs/`` and
    its pid in ``run/``.
    """

    data_dir: Path
    nodes: int = 3
    coordinators: int = 1
    port_base: int | None = 8080
    host: str = "127.0.0.1"
    database_url: str | None = None  # None: SQLite in the data directory (one coordinator)
    log_level: str = "warning"
    auth: bool = False
    # With auth: the tokens file every service reads; None: one made in the data directory
    # with a super user's token, kept for the next start.
    auth_tokens_file: Path | None = None
    super_users: str = ADMIN
    acl_refresh_ms: int | None = None
    tls: TlsFiles | None = None
    token: str | None = None  # the internal token; None: made once, kept in the data dir
    fsync: bool = True
    group_offset_partitions: int | None = None
    # The coordinators' --default-replication-factor (None: theirs, 1)
    default_replication_factor: int | None = None
    node_flags: Sequence[str] = ()
    coordinator_flags: Sequence[str] = ()
    # The URL the coordinators (hence the clients) are given for node N when it is not the
    # node's own, e.g. a proxy's in front of it.
    node_addresses: Mapping[int, str] = field(default_factory=dict)
    # The coordinator URLs node N verifies transactional batches with, when not every
    # coordinator's.
    verify_with: Mapping[int, str] = field(default_factory=dict)
    own_session: bool = True  # Ctrl-C at the terminal reaches only the parent
    node_ports: dict[int, int] = field(init=False)
    coordinator_ports: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if self.coordinators > 1 and not self.database_url:
            raise ValueError("several coordinators need a shared PostgreSQL --database-url")
        self.data_dir = self.data_dir.resolve()
        base = self.port_base
        self.coordinator_ports = [
            free_port() if base is None else base + i for i in range(self.coordinators)
        ]
        self.node_ports = {
            n: free_port() if base is None else base + 10 + n for n in range(1, self.nodes + 1)
        }

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def coordinator_urls(self) -> list[str]:
        return [f"{self.scheme}://{self.host}:{port}" for port in self.coordinator_ports]

    @property
    def bootstrap_list(self) -> str:
        """Every coordinator, comma-separated: what nodes and clients are given, so that
        any one coordinator being down is not an outage for them."""
        return ",".join(self.coordinator_urls)

    @property
    def node_urls(self) -> dict[int, str]:
        return {n: f"{self.scheme}://{self.host}:{port}" for n, port in self.node_ports.items()}

    @property
    def nodes_spec(self) -> str:
        """The coordinators' ``--nodes``: each node by the address it is known at."""
        urls = {**self.node_urls, **self.node_addresses}
        return ",".join(f"{n}={url}" for n, url in sorted(urls.items()))

    def internal_token(self) -> str:
        """The cluster's internal token: the plan's, or one made on first start and kept
        with the data."""
        if self.token is not None:
            return self.token
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

    def environment(self) -> dict[str, str]:
        """The services' environment: the internal token and, with ``auth``, the tokens
        file and the super users travel here rather than as flags, which ``ps`` shows."""
        env = dict(os.environ)
        env["EOS_INTERNAL_TOKEN"] = self.internal_token()
        if self.auth:
            if self.auth_tokens_file is None:
                self.admin_token()
            tokens = self.auth_tokens_file or self.data_dir / "tokens.toml"
            env["EOS_AUTH_TOKENS_FILE"] = str(tokens)
            env["EOS_SUPER_USERS"] = self.super_users
            if self.acl_refresh_ms is not None:
                env["EOS_ACL_REFRESH_MS"] = str(self.acl_refresh_ms)
        return env

    def _common_flags(self) -> list[str]:
        flags: list[str] = []
        if self.group_offset_partitions is not None:
            flags += ["--group-offset-partitions", str(self.group_offset_partitions)]
        return flags + (self.tls.flags() if self.tls else [])

    def _service(
        self, name: str, module: str, port: int, data_dir: Path, args: list[str]
    ) -> ServiceProcess:
        slug = name.replace(" ", "-")
        return ServiceProcess.python_module(
            name, module, args, port=port, host=self.host, scheme=self.scheme, data_dir=data_dir,
            verify=self.tls.context() if self.tls else True, env=self.environment(),
            log_path=self.data_dir / "logs" / f"{slug}.log",
            pid_path=self.data_dir / "run" / f"{slug}.pid", own_session=self.own_session,
        )  # fmt: skip

    def node(self, n: int) -> ServiceProcess:
        """Storage node ``n`` (from 1): it verifies transactional batches with every
        coordinator (or ``verify_with[n]``); with no coordinator, verification is off."""
        port = self.node_ports[n]
        args = node_args(
            n, port, self.data_dir / f"node-{n}", host=self.host, log_level=self.log_level,
            coordinators=self.verify_with.get(n) or self.bootstrap_list,
        )  # fmt: skip
        args += self._common_flags()
        if not self.fsync:
            args.append("--no-fsync")
        return self._service(
            f"node {n}", "partition_service", port, self.data_dir / f"node-{n}",
            [*args, *self.node_flags],
        )

    def coordinator(self, index: int) -> ServiceProcess:
        """Coordinator ``index`` (from 0), named ``coordinator <index + 1>``."""
        port = self.coordinator_ports[index]
        args = coordinator_args(
            port, self.nodes_spec, host=self.host, log_level=self.log_level,
            public_url=self.coordinator_urls[index], data_dir=self.data_dir / "coordinator",
            database_url=self.database_url,
        )  # fmt: skip
        args += self._common_flags()
        if self.default_replication_factor is not None:
            args += ["--default-replication-factor", str(self.default_replication_factor)]
        return self._service(
            f"coordinator {index + 1}", "coordinator_service", port,
            self.data_dir / "coordinator", [*args, *self.coordinator_flags],
        )

    def build(self) -> list[ServiceProcess]:
        """Every service, nodes first: the order they are started in."""
        return [*(self.node(n) for n in self.node_ports),
                *(self.coordinator(i) for i in range(self.coordinators))]  # fmt: skip


class LocalCluster:
    """A plan's services, started one after the other (each ready before the next) and
    stopped in two waves (``stop_in_waves``): for a test or a benchmark that kills, pauses
    and restarts single services, where ``eos up`` keeps them running under its supervisor
    instead."""

    def __init__(self, plan: ClusterPlan, *, start_timeout: float = 60.0) -> None:
        self.plan = plan
        self.start_timeout = start_timeout
        self.nodes = [plan.node(n) for n in plan.node_ports]  # node n at index n - 1
        self.coordinators = [plan.coordinator(i) for i in range(plan.coordinators)]

    @property
    def services(self) -> list[ServiceProcess]:
        return [*self.nodes, *self.coordinators]

    @property
    def url(self) -> str:
        """The first coordinator: enough for a client that takes one URL."""
        return self.plan.coordinator_urls[0]

    def node(self, n: int) -> ServiceProcess:
        """Storage node ``n`` (from 1)."""
        return self.nodes[n - 1]

    def start(self) -> LocalCluster:
        try:
            for service in self.services:
                service.start(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def restart_node(self, n: int) -> None:
        """SIGKILL node ``n`` and start it again on its port and data directory."""
        self.node(n).kill()
        self.node(n).start(self.start_timeout)

    def stop(self) -> None:
        """Stop every service: the coordinators, then the nodes they write markers to,
        each wave at once (``stop_in_waves``)."""
        stop_in_waves(self.services)

    def logs(self, lines: int | None = 30) -> str:
        """Every service's log (its last ``lines``), for a failure message."""
        parts = []
        for service in self.services:
            text = service.tail(lines) if lines is not None else service.tail(1 << 30)
            parts.append(f"--- {service.log_path.name}\n{text}")
        return "\n".join(parts)
