"""The services of a Jepsen-style run, each on a host of its own (``tests.jepsen.netns``).

A run needs what a deployment has and a one-machine test cluster lacks: services that can
lose sight of each other one link at a time, a database that can be partitioned away,
stopped or killed like any other host, and coordinators whose wall clocks disagree. So
every service gets a network namespace and listens on its host's address at the same port
(8080, PostgreSQL 5432), as on separate machines:

* ``pg``: a private PostgreSQL instance (never the machine's shared server, which other
  tests use): ``initdb`` into a scratch directory owned by ``postgres`` (the server
  refuses to run as root), trust authentication for the run's subnet, fsync off.
  ``setpriv`` drops to ``postgres`` and then execs, so the pid held is the postmaster's
  and SIGSTOP or SIGKILL hit the server itself (``runuser`` forks and waits: its child
  would be left running when it is killed).
* ``c1..cN``: ``python -m coordinator_service`` on that database, ``n1..nM``: ``python -m
  partition_service``, both with the flags of the product's launcher
  (``eos_cli.launcher``), so what runs is what ``eos up`` runs. A test may name its own
  modules, wrappers that plant a bug before running the service.
* ``cl1..clK``: namespaces only, for the workloads (``client_argv``).

A coordinator may run with its wall clock skewed (``restart(name, clock_offset_s=...)``):
libfaketime is preloaded into that process alone, with CLOCK_MONOTONIC left real, so its
timestamps and lease deadlines drift while the history's monotonic times stay one clock
(``SKEWED_BOOT`` works around what libfaketime breaks in Python).

The test process stays in the root namespace and reaches every host through the bridge,
which no fault touches: readiness probes, ``leader_of`` and the nemesis keep working
whatever the run cut.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from eos_cli.launcher import ServiceError, ServiceProcess, coordinator_args, node_args
from tests.jepsen.netns import Host, Network, kill_namespace, namespace_pids
from tests.support.cluster import FAST_LOOPS, START_TIMEOUT_S

#: Where ``-m tests.jepsen...`` is found from any working directory.
REPO = Path(__file__).resolve().parents[2]
PORT = 8080
PG_PORT = 5432
PG_USER = "postgres"
DATABASE = "eos"
#: The environment variables that skew a clock; a workload's environment never has them.
FAKETIME_VARS = ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")
#: How a service with a skewed clock starts: ``python -c SKEWED_BOOT <module> <args>``.
#: libfaketime 0.9.10 (Debian 12) with FAKETIME_DONT_FAKE_MONOTONIC fails Python's
#: ``time.sleep`` with EINVAL (it shifts the absolute CLOCK_MONOTONIC deadline Python hands
#: to ``clock_nanosleep`` as if it were a wall time); without that variable the monotonic
#: clock is skewed as well and every lock wait with a timeout hangs. So the service's
#: ``time.sleep`` waits in ``select()`` instead, which works under libfaketime, and then
#: the module runs as ``-m`` would run it.
SKEWED_BOOT = textwrap.dedent("""
    import runpy, select, sys, time

    def sleep(seconds):
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = sleep
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
""")
#: How long a service that was asked to stop may take before it is killed.
STOP_TIMEOUT_S = 10.0


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's binaries (``/usr/lib/postgresql/<ver>/bin``)."""
    found = [
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/postgres")
        if (path.parent / "initdb").exists() and path.parent.parent.name.isdigit()
    ]
    if not found:
        raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/<ver>/bin)")
    return max(found, key=lambda path: int(path.parent.name))


def faketime_library() -> Path | None:
    """libfaketime's shared object, where Debian's ``faketime`` package puts it."""
    for candidate in sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")):
        return candidate
    fallback = Path("/usr/lib/faketime/libfaketime.so.1")
    return fallback if fallback.exists() else None


def ensure_faketime() -> Path:
    """libfaketime, installed with apt-get when it is missing (a fresh machine); a
    ``RuntimeError`` saying why when it cannot be had."""
    library = faketime_library()
    if library is not None:
        return library
    try:
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "faketime"], capture_output=True, text=True,
            timeout=600, check=False, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
        output = (done.stdout + done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as error:
        output = str(error)
    library = faketime_library()
    if library is None:
        tail = "\n".join(output.splitlines()[-10:])
        raise RuntimeError(f"libfaketime is missing and `apt-get install faketime` failed:\n{tail}")
    return library


def skewed(env: Mapping[str, str], offset_s: float) -> dict[str, str]:
    """``env`` with the wall clock ``offset_s`` seconds off (libfaketime), the monotonic
    clock untouched; ``env`` without any skew when ``offset_s`` is 0."""
    plain = {key: value for key, value in env.items() if key not in FAKETIME_VARS}
    if offset_s == 0:
        return plain
    return {
        **plain,
        "LD_PRELOAD": str(ensure_faketime()),
        "FAKETIME": f"{offset_s:+.3f}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@dataclass(frozen=True)
class HostSpec:
    """What a ``HostCluster`` is made of. The modules let a test start a service through
    a wrapper module that plants a bug; ``clock_offsets`` skews coordinators from the
    start (``(("c2", 300.0),)``)."""

    coordinators: int = 3
    nodes: int = 3
    clients: int = 3
    lease_ms: int = 3000
    replication_factor: int = 3
    log_level: str = "warning"
    group_offset_partitions: int = 5
    coordinator_flags: tuple[str, ...] = ()
    node_flags: tuple[str, ...] = ()
    node_module: str = "partition_service"
    coordinator_module: str = "coordinator_service"
    clock_offsets: tuple[tuple[str, float], ...] = ()


class HostCluster:
    """PostgreSQL, coordinators, storage nodes and client hosts, each in a namespace of
    one ``Network``; ``start`` brings them up, ``stop`` leaves nothing behind."""

    def __init__(self, root: Path, spec: HostSpec | None = None) -> None:
        self.root = root
        self.spec = spec or HostSpec()
        self.token = secrets.token_urlsafe(32)
        self.network: Network | None = None
        self.services: dict[str, ServiceProcess] = {}
        self.clock_offsets: dict[str, float] = dict(self.spec.clock_offsets)
        self.pg_dir: Path | None = None
        self.coordinator_names = [f"c{i}" for i in range(1, self.spec.coordinators + 1)]
        self.node_names = [f"n{i}" for i in range(1, self.spec.nodes + 1)]
        self.client_names = [f"cl{i}" for i in range(1, self.spec.clients + 1)]
        self._stopped = False

    # --- addresses ---------------------------------------------------------------------

    @property
    def net(self) -> Network:
        if self.network is None:
            raise RuntimeError("the cluster is not started")
        return self.network

    @property
    def hosts(self) -> dict[str, Host]:
        return dict(self.net.hosts)

    def url(self, name: str) -> str:
        return f"http://{self.net.hosts[name].address}:{PORT}"

    @property
    def coordinator_urls(self) -> list[str]:
        return [self.url(name) for name in self.coordinator_names]

    @property
    def node_urls(self) -> dict[int, str]:
        return {i: self.url(f"n{i}") for i in range(1, self.spec.nodes + 1)}

    @property
    def bootstrap(self) -> str:
        """Every coordinator, comma-separated: what nodes and clients start from."""
        return ",".join(self.coordinator_urls)

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://{PG_USER}@{self.net.hosts['pg'].address}:{PG_PORT}/{DATABASE}"

    def logs_hint(self) -> str:
        return f"the services' logs are in {self.root / 'logs'}"

    # --- environments ------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in FAKETIME_VARS}
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
        return env

    def environment(self, name: str) -> dict[str, str]:
        """The environment service ``name`` runs (or will run) with: the internal token,
        and its clock skew if it has one."""
        env = {**self._base_env(), "EOS_INTERNAL_TOKEN": self.token}
        return skewed(env, self.clock_offsets.get(name, 0.0))

    def client_env(self) -> dict[str, str]:
        """A workload's environment: the repository importable, no clock skew."""
        return self._base_env()

    def client_argv(self, client: str, argv: list[str]) -> list[str]:
        """``argv`` run on client host ``client``."""
        return self.net.argv(client, argv)

    # --- building ----------------------------------------------------------------------

    def _service(self, name: str, argv: list[str], port: int) -> ServiceProcess:
        return ServiceProcess(
            name, self.net.argv(name, argv), port=port, host=self.net.hosts[name].address,
            log_path=self.root / "logs" / f"{name}.log", env=self.environment(name),
            data_dir=self.root / "data" / name,
        )  # fmt: skip

    def _python(self, name: str, module: str, args: list[str]) -> ServiceProcess:
        """``python -m module args`` on host ``name``, booted through ``SKEWED_BOOT`` when
        its clock is skewed."""
        if self.clock_offsets.get(name, 0.0):
            argv = [sys.executable, "-c", SKEWED_BOOT, module, *args]
        else:
            argv = [sys.executable, "-m", module, *args]
        return self._service(name, argv, PORT)

    def _node(self, index: int) -> ServiceProcess:
        name = f"n{index}"
        args = node_args(
            index, PORT, self.root / "data" / name, coordinators=self.bootstrap,
            host=self.net.hosts[name].address, log_level=self.spec.log_level,
        )  # fmt: skip
        args += ["--no-fsync", "--group-offset-partitions", str(self.spec.group_offset_partitions)]
        return self._python(name, self.spec.node_module, [*args, *self.spec.node_flags])

    def _coordinator(self, name: str) -> ServiceProcess:
        nodes = ",".join(f"{n}={url}" for n, url in self.node_urls.items())
        address = self.net.hosts[name].address
        args = coordinator_args(
            PORT, nodes, data_dir=self.root / "data" / name, database_url=self.database_url,
            public_url=self.url(name), host=address, log_level=self.spec.log_level,
        )  # fmt: skip
        args += [*FAST_LOOPS, "--lease-ms", str(self.spec.lease_ms),
                 "--default-replication-factor", str(self.spec.replication_factor),
                 "--group-offset-partitions", str(self.spec.group_offset_partitions),
                 *self.spec.coordinator_flags]  # fmt: skip
        return self._python(name, self.spec.coordinator_module, args)

    def _build(self, name: str) -> ServiceProcess:
        """Service ``name`` (``cN`` or ``nN``) as it is to run now (clock skew included)."""
        if name in self.coordinator_names:
            return self._coordinator(name)
        return self._node(int(name.removeprefix("n")))

    def _postgres(self) -> ServiceProcess:
        """``initdb`` in a scratch directory ``postgres`` owns (the run folder may sit
        under a directory only root can enter), and the server's ``ServiceProcess``."""
        binaries = postgres_bin()
        owner = pwd.getpwnam(PG_USER)
        self.pg_dir = self.net.scratch_dir("pg")
        os.chown(self.pg_dir, owner.pw_uid, owner.pw_gid)
        data = self.pg_dir / "data"
        subprocess.run(
            [*self._as_postgres(), str(binaries / "initdb"), "-D", str(data), "-A", "trust",
             "-U", PG_USER, "-E", "UTF8", "--locale=C", "--no-sync"],
            check=True, capture_output=True, text=True, timeout=120, cwd=self.pg_dir,
        )  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.net.subnet} trust\n")
        argv = [*self._as_postgres(), str(binaries / "postgres"), "-D", str(data),
                "-k", str(self.pg_dir), "-p", str(PG_PORT),
                "-c", f"listen_addresses={self.net.hosts['pg'].address}",
                "-c", "fsync=off", "-c", "full_page_writes=off",
                "-c", "synchronous_commit=off", "-c", "max_connections=300"]  # fmt: skip
        return self._service("pg", argv, PG_PORT)

    @staticmethod
    def _as_postgres() -> list[str]:
        """``setpriv``, which execs (``runuser`` would fork and hold the server as its
        child, so that its pid is not the postmaster's)."""
        setpriv = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin")
        if setpriv is None:
            raise RuntimeError("setpriv (util-linux) is needed to run PostgreSQL as postgres")
        return [setpriv, f"--reuid={PG_USER}", f"--regid={PG_USER}", "--init-groups", "--"]

    def _pg_ready(self) -> bool:
        ready = subprocess.run(
            [str(postgres_bin() / "pg_isready"), "-h", self.net.hosts["pg"].address,
             "-p", str(PG_PORT), "-U", PG_USER, "-d", "postgres", "-q", "-t", "2"],
            check=False, timeout=10,
        )  # fmt: skip
        return ready.returncode == 0

    def _wait_pg(self, timeout: float) -> None:
        service = self.services["pg"]
        deadline = time.monotonic() + timeout
        while not self._pg_ready():
            code = service.exit_code()
            if code is not None:
                raise ServiceError(f"PostgreSQL exited with {code}:\n{service.tail()}")
            if time.monotonic() > deadline:
                raise ServiceError(f"PostgreSQL not ready after {timeout:.0f}s:\n{service.tail()}")
            time.sleep(0.1)

    # --- life --------------------------------------------------------------------------

    def start(self) -> HostCluster:
        """Every host and service, each ready (generous timeouts: a loaded two-core
        machine imports six services at once). A failure stops what was started."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if self.clock_offsets:
                ensure_faketime()
            self.network = Network()
            for name in ["pg", *self.coordinator_names, *self.node_names, *self.client_names]:
                self.network.add_host(name)
            self.services["pg"] = self._postgres()
            self.services["pg"].launch()
            self._wait_pg(START_TIMEOUT_S)
            address = self.net.hosts["pg"].address
            with psycopg.connect(host=address, port=PG_PORT, user=PG_USER, dbname="postgres",
                                 autocommit=True) as conn:  # fmt: skip
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
            for name in [*self.node_names, *self.coordinator_names]:
                self.services[name] = self._build(name)
            # all at once: imports overlap with waits, and nodes and coordinators meet
            # each other whichever comes up first
            started = [self.services[name] for name in [*self.node_names, *self.coordinator_names]]
            for service in started:
                service.launch()
            deadline = time.monotonic() + START_TIMEOUT_S
            for service in started:
                service.wait_ready(max(deadline - time.monotonic(), 1.0))
        except BaseException as error:
            with contextlib.suppress(Exception):
                self.stop()
            if isinstance(error, Exception):
                raise ServiceError(f"the cluster did not start ({self.logs_hint()})") from error
            raise
        return self

    def drop(self, src: str, dst: str) -> None:
        """Lose what host ``src`` sends to host ``dst`` (``Network.drop``)."""
        self.net.drop(src, dst)

    def cut(self, a: str, b: str) -> None:
        self.net.cut(a, b)

    def heal_network(self) -> None:
        self.net.heal()

    def heal_all(self) -> None:
        """Undo every fault: the network healed, paused services resumed, dead ones
        started again (with true clocks), not waiting for them to be ready."""
        self.net.heal()
        for name, service in self.services.items():
            if service.alive():
                self.resume(name)
            elif name == "pg":
                self._restart_pg(wait=False)
            else:
                self._relaunch(name, 0.0)

    def wait_all_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until every service answers (PostgreSQL first: the others need it)."""
        deadline = time.monotonic() + timeout
        if "pg" in self.services:
            self._wait_pg(timeout)
        for name, service in self.services.items():
            if name != "pg":
                service.wait_ready(max(deadline - time.monotonic(), 1.0))

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` and reap it; for ``pg`` every process of its host (a
        backend would serve its connection on for a while after its postmaster died)."""
        if name == "pg":
            self._signal_host("pg", signal.SIGKILL)
        self.services[name].kill()

    def pause(self, name: str) -> None:
        """SIGSTOP service ``name``; for ``pg`` every process of its host, as a frozen
        machine (the postmaster alone stopped, its backends would go on serving)."""
        if name == "pg":
            self._signal_host("pg", signal.SIGSTOP)
        else:
            self.services[name].pause()

    def resume(self, name: str) -> None:
        if name == "pg":
            self._signal_host("pg", signal.SIGCONT)
        else:
            self.services[name].resume()

    def _signal_host(self, name: str, sig: signal.Signals) -> None:
        for pid in namespace_pids(self.net.namespace_of(name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def restart(self, name: str, clock_offset_s: float = 0.0) -> None:
        """SIGKILL service ``name`` if it runs, start it again on its address and data
        (a coordinator with its wall clock ``clock_offset_s`` off) and wait until it is
        ready."""
        service = self.services[name]
        service.kill()
        if name == "pg":
            self._restart_pg()
            return
        self._relaunch(name, clock_offset_s)
        service.wait_ready(START_TIMEOUT_S)

    def _relaunch(self, name: str, clock_offset_s: float) -> None:
        """Launch service ``name`` again with its clock ``clock_offset_s`` off (the same
        ``ServiceProcess``: its address, log and data stay)."""
        self.clock_offsets[name] = clock_offset_s
        if clock_offset_s:
            ensure_faketime()
        built = self._build(name)
        service = self.services[name]
        service.argv, service.env = built.argv, built.env
        service.launch()

    def _restart_pg(self, wait: bool = True) -> None:
        """Backends outlive a killed postmaster for a moment and hold its shared memory,
        which a new postmaster refuses to share: they go first."""
        namespace = self.net.hosts["pg"].namespace
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while namespace_pids(namespace) and time.monotonic() < deadline:
            kill_namespace(namespace)
            time.sleep(0.05)
        self.services["pg"].launch()
        if wait:
            self._wait_pg(START_TIMEOUT_S)

    def stop(self) -> None:
        """Every process stopped (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) and reaped,
        coordinators first, then nodes, then PostgreSQL; then the network removed. Goes on
        past any failure and raises the first at the end."""
        if self._stopped:
            return
        self._stopped = True
        errors: list[BaseException] = []
        waves = [self.coordinator_names, self.node_names, ["pg"]]
        for wave in waves:
            present = [self.services[name] for name in wave if name in self.services]
            for service in present:
                try:
                    if service.name == "pg" and service.alive():
                        service.resume()
                        service.process.send_signal(signal.SIGINT)  # type: ignore[union-attr]
                    else:
                        service.ask_to_stop()
                except Exception as error:
                    errors.append(error)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for service in present:
                try:
                    service.wait_stopped(deadline)
                except Exception as error:
                    errors.append(error)
        if self.network is not None:
            try:
                self.network.close()  # also kills stragglers and removes the pg directory
            except Exception as error:
                errors.append(error)
        if errors:
            raise RuntimeError(f"stopping the cluster: {errors[0]!r}") from errors[0]

    # --- looking -----------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The node leading ``topic``/``partition`` as a live coordinator's metadata says,
        None when none answers or it names no leader."""
        for name in self.coordinator_names:
            if not self.services[name].alive():
                continue
            try:
                answer = httpx.get(self.url(name) + "/v1/metadata", timeout=2.0)
                answer.raise_for_status()
            except httpx.HTTPError:
                continue
            for entry in answer.json().get("topics", []):
                if entry.get("name") != topic:
                    continue
                for info in entry.get("partitions", []):
                    if info.get("partition") == partition and info.get("leader"):
                        return int(info["leader"]["node_id"])
            return None
        return None
