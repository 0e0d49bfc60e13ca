"""A Spark standalone cluster on this machine, outside containers, started from the
pip-installed PySpark (``bin/spark-class`` with the ``Master`` and ``Worker`` classes).

Why not local mode: there the executor lives in the driver's JVM on one host, and Spark
never starts a speculative copy of a task on the host its running attempt is on, so
neither a speculative copy nor a lost executor can happen. Here each worker binds its own
loopback address (all of 127/8 is the loopback on Linux): ``--host`` names it to the
master, and ``SPARK_LOCAL_IP``, which the executors inherit from their worker, makes them
bind there too. To Spark the workers are different hosts; the driver stays on 127.0.0.1.

What the executors run is this checkout: ``PYSPARK_PYTHON`` is this interpreter (and the
SDK installed beside it) and ``PYTHONPATH`` the repository, so transforms of the test
package load there as on the driver. The workers have both in their environment, as a
cluster's installation would; PySpark, though, sends every task the driver's
``PYSPARK_PYTHON``, so ``driver_env`` sets it too.

Every process listens on free ports, never Spark's defaults (7077, 8080, the master's
REST port 6066 is turned off), and keeps its log, work and scratch directories under
``root``. Each is started in a session of its own, and ``stop`` kills every process of
those sessions: the master, the workers, the executor JVMs a worker starts and the Python
daemons of the executors (which move to a process group of their own, so killing the
worker's group would leave them behind).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from eos_cli.launcher import ServiceError, ServiceProcess, free_port

REPOSITORY = Path(__file__).resolve().parents[2]
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DRIVER_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ProcessInfo:
    """One line of ``/proc/<pid>/stat``, the fields this module needs."""

    pid: int
    parent: int
    session: int
    zombie: bool


@dataclass(frozen=True)
class Executor:
    """An executor JVM of the cluster, as its command line names it."""

    pid: int
    executor_id: str
    host: str


def spark_home() -> Path:
    """The installed ``pyspark`` package, which holds ``bin/spark-class`` and the jars."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ServiceError("pyspark is not installed: no Spark to start a cluster with")
    return Path(spec.origin).parent


def process_info(pid: int) -> ProcessInfo | None:
    """``pid``'s parent and session; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields follow the last ')'.
    state, parent, _group, session = stat.rsplit(")", 1)[1].split()[:4]
    return ProcessInfo(pid, int(parent), int(session), state == "Z")


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments; empty once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def session_members(session: int) -> list[int]:
    """The live processes (zombies are dead already) of ``session``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = process_info(int(entry.name))
            if info is not None and info.session == session and not info.zombie:
                members.append(info.pid)
    return members


def kill_session(session: int, timeout: float = 15.0) -> None:
    """SIGKILL every process of ``session`` until none is left (a worker may fork an
    executor while its siblings are being killed)."""
    deadline = time.monotonic() + timeout
    while members := session_members(session):
        if time.monotonic() > deadline:
            raise ServiceError(f"processes {members} of session {session} survive SIGKILL")
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class StandaloneCluster:
    """A master on 127.0.0.1 and one worker per address of ``hosts``, each offering
    ``cores`` cores and ``memory`` to executors of ``executor_memory``.

    ``with StandaloneCluster(tmp_path / "spark") as spark:`` starts it and waits until the
    master lists every worker alive, and stops it whatever happens."""

    def __init__(
        self,
        root: Path,
        hosts: Sequence[str] = ("127.0.0.2", "127.0.0.3"),
        *,
        cores: int = 1,
        memory: str = "1g",
        executor_memory: str = "512m",
        python: str = sys.executable,
        start_timeout: float = 90.0,
    ) -> None:
        self.root = root
        self.hosts = tuple(hosts)
        self.cores = cores
        self.executor_memory = executor_memory
        self.python = python
        self.start_timeout = start_timeout
        self.port = free_port()
        self.web_port = free_port()
        self._spark_class = str(spark_home() / "bin" / "spark-class")
        self._conf_dir = root / "conf"
        self.master = self._process(
            "master",
            DRIVER_HOST,
            "org.apache.spark.deploy.master.Master",
            self.web_port,
            ["--host", DRIVER_HOST, "--port", str(self.port)],
        )
        self.workers = []
        for n, host in enumerate(self.hosts, 1):
            name = f"worker-{n}"
            self.workers.append(self._process(
                name, host, "org.apache.spark.deploy.worker.Worker", free_port(),
                ["--host", host, "--port", str(free_port()), "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(root / name / "work"), self.master_url],
            ))  # fmt: skip

    @property
    def master_url(self) -> str:
        return f"spark://{DRIVER_HOST}:{self.port}"

    @property
    def processes(self) -> list[ServiceProcess]:
        return [self.master, *self.workers]

    def _process(
        self, name: str, host: str, main_class: str, web_port: int, args: list[str]
    ) -> ServiceProcess:
        """``spark-class main_class args`` bound to ``host``, its web UI on ``web_port``,
        with its log and scratch directory in ``root/name``."""
        home = self.root / name
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self._conf_dir),  # ours alone, not one on this machine
            "SPARK_LOCAL_IP": host,  # what the process and its executors bind
            "SPARK_LOCAL_DIRS": str(home / "scratch"),  # the executors' block managers
            "PYSPARK_PYTHON": self.python,
            "PYTHONPATH": _with_repository(os.environ.get("PYTHONPATH")),
        }
        argv = [self._spark_class, main_class, *args, "--webui-port", str(web_port)]
        return ServiceProcess(
            name,
            argv,
            port=web_port,
            log_path=home / "log.txt",
            host=host,
            env=env,
            own_session=True,
            ready_path="/json/",
            data_dir=home,
        )

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once the master lists them all
        alive. Fails (``ServiceError`` with a log's tail) if any exits or is late."""
        self._conf_dir.mkdir(parents=True, exist_ok=True)
        # Read by the master and the workers: no REST submission server on port 6066.
        (self._conf_dir / "spark-defaults.conf").write_text("spark.master.rest.enabled false\n")
        for process in self.processes:
            (self.root / process.name / "scratch").mkdir(parents=True, exist_ok=True)
        try:
            self.master.start(self.start_timeout)
            for worker in self.workers:
                worker.launch()
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        with httpx.Client(timeout=2.0) as client:
            while set(self.hosts) - set(self.alive_workers(client)):
                for process in self.processes:
                    if process.exit_code() is not None:
                        raise ServiceError(
                            f"{process.name} exited while starting; see "
                            f"{process.log_path}:\n{process.tail()}"
                        )
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"the Spark master lists {self.alive_workers(client)} alive after "
                        f"{self.start_timeout:.0f}s, not {list(self.hosts)}"
                    )
                time.sleep(0.1)

    def alive_workers(self, client: httpx.Client) -> list[str]:
        """Hosts of the workers the master's JSON page lists alive."""
        try:
            state = client.get(f"{self.master.url}/json/").json()
        except (httpx.HTTPError, ValueError):
            return []
        return [w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self) -> None:
        """Kill every process of every session the cluster started, and reap its own;
        a session that will not die is reported after the others are killed."""
        failures = []
        for process in reversed(self.processes):
            if process.pid is None:
                continue
            try:
                kill_session(process.pid)
            except ServiceError as error:
                failures.append(error)
            if process.process is not None:
                process.process.wait(timeout=15)
        if failures:
            raise ServiceError("; ".join(map(str, failures)))

    def executors(self) -> list[Executor]:
        """The executor JVMs the workers run now."""
        sessions = {w.pid for w in self.workers if w.pid is not None}
        found = []
        for session in sessions:
            for pid in session_members(session):
                executor = _as_executor(pid)
                if executor is not None:
                    found.append(executor)
        return found

    def executor_of(self, pid: int) -> Executor:
        """The executor JVM ``pid`` runs under (a task's Python worker: its daemon's
        parent), which must be one of this cluster's."""
        ours = {e.pid: e for e in self.executors()}
        walked = []
        info = process_info(pid)
        while info is not None and info.pid > 1:
            walked.append(info.pid)
            if info.pid in ours:
                return ours[info.pid]
            info = process_info(info.parent)
        raise LookupError(f"no executor of this cluster above {walked}; ours: {ours}")

    def driver_conf(self) -> dict[str, str]:
        """The settings a driver on this machine needs to run on the cluster: its address,
        one small executor per worker, and to start only once every executor is there."""
        return {
            "spark.driver.host": DRIVER_HOST,
            "spark.driver.bindAddress": DRIVER_HOST,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.cores * len(self.hosts)),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.local.dir": str(self.root / "driver" / "scratch"),
            "spark.ui.enabled": "false",
        }

    def driver_env(self) -> dict[str, str]:
        """The environment of a driver process: the Python its tasks run (PySpark sends
        the driver's ``PYSPARK_PYTHON`` with every task), this checkout importable, and
        the driver's own address."""
        return {
            **os.environ,
            "PYSPARK_PYTHON": self.python,
            "PYTHONPATH": _with_repository(os.environ.get("PYTHONPATH")),
            "SPARK_LOCAL_IP": DRIVER_HOST,
        }

    def logs(self) -> Iterator[Path]:
        """Every log of the cluster: its processes' and the executors' (under the
        workers' work directories), for a failing test to point at."""
        yield from (p.log_path for p in self.processes)
        yield from sorted(self.root.glob("worker-*/work/*/*/std*"))

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _as_executor(pid: int) -> Executor | None:
    args = command_line(pid)
    if EXECUTOR_CLASS not in args:
        return None

    def value(flag: str) -> str:
        return args[args.index(flag) + 1] if flag in args else ""

    return Executor(pid, value("--executor-id"), value("--hostname"))


def _with_repository(path: str | None) -> str:
    """``PYTHONPATH`` with this checkout first (``tests`` is not an installed package)."""
    return os.pathsep.join(p for p in (str(REPOSITORY), path) if p)
