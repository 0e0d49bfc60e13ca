"""The cluster a chaos run works against: storage-node processes, one or two coordinator
processes on a PostgreSQL database, and optionally fault proxies between them.

With ``proxied_node`` set, that node is known to the whole cluster by its proxy's URL (the
coordinators' ``--nodes`` setting, hence the metadata every client reads), and the node
verifies transactional batches through a second proxy in front of a coordinator. Both
directions of coordinator-node traffic can then be slowed or cut; the plans only touch
``/internal/`` paths by default, so client traffic through the proxy flows untouched.

Ports are fixed when the cluster is made, so a process killed and started again comes
back at the same address, as a restarted server would.

``PrivatePostgres`` is a PostgreSQL 15 instance a test may restart at will. The machine's
shared cluster on 5432 serves other tests at the same time, so it is never touched: this one
is made with ``initdb`` in a temporary directory owned by ``postgres`` (the server refuses
to run as root), listens on loopback on a free port below 32000 with trust authentication,
and is stopped and removed at the end. ``restart(immediate=True)`` is the harsh version:
``pg_ctl stop -m immediate`` kills the server without a checkpoint, so the next start
replays the WAL, as after a crash.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.chaos.proxy import FaultProxy, low_port
from tests.support.coordinators import CoordinatorProcess
from tests.support.nodes import NodeProcess
from tests.support.processes import wait_until

OFFSET_PARTITIONS = 5


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 2
    coordinators: int = 1
    lease_ms: int = 10_000
    fsync: bool = False
    proxied_node: int | None = None
    node_extra: tuple[str, ...] = ()
    # The one coordinator (index) every node and client is configured with; None: each
    # is given every coordinator, starting at a different one. With an entry, nodes and
    # clients learn the other instances from the cluster.
    entry: int | None = None
    # How long a coordinator may take before a node or client asks the next one.
    coordinator_timeout_ms: int = 2_000


class ChaosCluster:
    def __init__(self, root: Path, database_url: str, spec: ClusterSpec) -> None:
        self.root = root
        self.database_url = database_url
        self.spec = spec
        self.node_ports = {n: low_port() for n in range(1, spec.nodes + 1)}
        self.coordinator_ports = [low_port() for _ in range(spec.coordinators)]
        self.node_proxy: FaultProxy | None = None
        self.coordinator_proxy: FaultProxy | None = None
        if spec.proxied_node is not None:
            self.node_proxy = FaultProxy(self.node_ports[spec.proxied_node], seed=1)
            self.coordinator_proxy = FaultProxy(self.coordinator_ports[0], seed=2)
        self.nodes: dict[int, NodeProcess] = {}
        self.coordinators: list[CoordinatorProcess] = []
        self.restarts = 0

    def coordinator_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.coordinator_ports[index % len(self.coordinator_ports)]}"

    @property
    def nodes_spec(self) -> str:
        """``--nodes`` of the coordinators: the proxied node by its proxy's URL."""
        urls = {n: f"http://127.0.0.1:{port}" for n, port in self.node_ports.items()}
        if self.node_proxy is not None and self.spec.proxied_node is not None:
            urls[self.spec.proxied_node] = self.node_proxy.url
        return ",".join(f"{n}={url}" for n, url in urls.items())

    def coordinator_list(self, index: int = 0) -> str:
        """Every coordinator, comma-separated, starting at the ``index``-th (or only the
        entry coordinator, when the spec names one)."""
        if self.spec.entry is not None:
            return self.coordinator_url(self.spec.entry)
        count = len(self.coordinator_ports)
        return ",".join(self.coordinator_url(index + i) for i in range(count))

    def bootstrap(self, index: int = 0) -> str:
        """What a client starts from; spread clients over the coordinators by index."""
        return self.coordinator_list(index)

    def start(self) -> ChaosCluster:
        try:
            for proxy in (self.node_proxy, self.coordinator_proxy):
                if proxy is not None:
                    proxy.start()
            for n, port in self.node_ports.items():
                verify = self.coordinator_list(n - 1)
                if n == self.spec.proxied_node and self.coordinator_proxy is not None:
                    verify = self.coordinator_proxy.url
                extra = ["--group-offset-partitions", str(OFFSET_PARTITIONS)]
                extra += ["--coordinator-timeout-ms", str(self.spec.coordinator_timeout_ms)]
                extra += [] if self.spec.fsync else ["--no-fsync"]
                extra += self.spec.node_extra
                node = NodeProcess(
                    self.root / f"node-{n}", node_id=n, port=port, coordinator_url=verify,
                    extra=extra,
                )  # fmt: skip
                self.nodes[n] = node
                node.start()
            for index, port in enumerate(self.coordinator_ports):
                coordinator = CoordinatorProcess(
                    self.root / "coordinators",
                    database_url=self.database_url,
                    nodes=self.nodes_spec,
                    name=f"c{index}",
                    port=port,
                    extra=[
                        "--group-offset-partitions", str(OFFSET_PARTITIONS),
                        "--lease-ms", str(self.spec.lease_ms),
                        "--marker-backoff-max-ms", "200",
                        "--reconcile-interval-ms", "100",
                        "--expiry-scan-interval-ms", "200",
                        "--node-timeout-ms", "3000",
                    ],
                )  # fmt: skip
                self.coordinators.append(coordinator)
                coordinator.start(timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def restart_node(self, node_id: int) -> None:
        """SIGKILL the node and start it again on its port and data directory."""
        node = self.nodes[node_id]
        node.kill()
        node.start(timeout=60)

    def restart_coordinator(self, index: int) -> None:
        """Start a killed coordinator again on its port, as a new instance: an instance id
        names one process's life (its row and its leases), so a restart takes a new one."""
        coordinator = self.coordinators[index]
        at = coordinator.args.index("--instance-id") + 1
        self.restarts += 1
        coordinator.args[at] = f"c{index}-{coordinator.port}-r{self.restarts}"
        coordinator.start(timeout=60)

    def stop(self) -> None:
        for process in [*self.coordinators, *self.nodes.values()]:
            process.stop()
        for proxy in (self.node_proxy, self.coordinator_proxy):
            if proxy is not None:
                proxy.stop()

    def logs(self, lines: int = 30) -> str:
        """The tail of every service's log, for a failure message."""
        parts = []
        for process in [*self.coordinators, *self.nodes.values()]:
            parts.append(f"--- {process.log_path.name}\n{process.tail(lines)}")
        return "\n".join(parts)


BIN = Path(os.environ.get("EOS_CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))
OWNER = "postgres"


def available() -> bool:
    """Whether a private instance can be made here (the binaries and the user exist)."""
    try:
        pwd.getpwnam(OWNER)
    except KeyError:
        return False
    return (BIN / "initdb").exists() and (BIN / "pg_ctl").exists()


def _runuser() -> str:
    """``runuser`` lives in /usr/sbin, which a bare CI environment's PATH may leave out."""
    found = shutil.which("runuser") or shutil.which(
        "runuser", path="/usr/sbin:/sbin:/usr/bin:/bin"
    )
    if found is None:
        raise AssertionError("runuser is needed to run the private PostgreSQL as postgres")
    return found


class PrivatePostgres:
    """``with PrivatePostgres.running() as pg: pg.url("eos")``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eos-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = low_port()
        self.restarts = 0
        owner = pwd.getpwnam(OWNER)
        os.chown(self.root, owner.pw_uid, owner.pw_gid)

    def _as_owner(self, *command: str) -> subprocess.CompletedProcess[str]:
        args = list(command)
        if os.geteuid() == 0:
            args = [_runuser(), "-u", OWNER, "--", *args]
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        self._as_owner(
            str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", OWNER,
            "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c fsync=off -c full_page_writes=off"
        )
        self._as_owner(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "60", "start",
        )  # fmt: skip
        wait_until(self.accepting, timeout=30, what="the private PostgreSQL to accept")

    def stop(self, *, immediate: bool = False) -> None:
        mode = "immediate" if immediate else "fast"
        self._as_owner(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, *, immediate: bool = True) -> None:
        self.stop(immediate=immediate)
        self.start()
        self.restarts += 1

    def accepting(self) -> bool:
        try:
            with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={OWNER} dbname={dbname}"

    def create_database(self, name: str) -> str:
        """A new database; returns its SQLAlchemy URL."""
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://{OWNER}@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop(immediate=True)
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[PrivatePostgres]:
        instance = cls()
        try:
            instance.init()
            instance.start()
            yield instance
        finally:
            instance.destroy()
