"""The cluster a chaos run works against, and the PostgreSQL it may restart.

The cluster is the tests' one cluster (``tests.support.cluster``) with the chaos runs'
settings (``chaos_spec``): storage-node processes, one or two coordinator processes on a
PostgreSQL database, and optionally fault proxies between them. With ``proxied_node``
set, that node is known to the whole cluster by its proxy's URL (the coordinators'
``--nodes`` setting, hence the metadata every client reads), and the node verifies
transactional batches through a second proxy in front of a coordinator. Both directions
of coordinator-node traffic can then be slowed or cut; the plans only touch
``/internal/`` paths by default, so client traffic through the proxy flows untouched.

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
from pathlib import Path
from typing import Any

import psycopg

from tests.support.cluster import ClusterSpec
from tests.support.processes import free_port, wait_until


def chaos_spec(**fields: Any) -> ClusterSpec:
    """A chaos run's cluster: 10 s leases, nodes that ask the next coordinator after 2 s,
    and coordinators that scan for expired transactions every 200 ms and give up on a node
    after 3 s, so that each fault is resolved within the run's time."""
    defaults: dict[str, Any] = {
        "lease_ms": 10_000,
        "coordinator_timeout_ms": 2_000,
        "coordinator_flags": ("--expiry-scan-interval-ms", "200", "--node-timeout-ms", "3000"),
        # EOS_CHAOS_LOG_LEVEL=info: the services' decisions in the logs a failure prints
        "log_level": os.environ.get("EOS_CHAOS_LOG_LEVEL", "warning"),
    }
    return ClusterSpec(**{**defaults, **fields})


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
        self.port = free_port()
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
        """``pg_isready``: a server that is starting may fail a connection attempt half
        way, and psycopg then leaves a connection object for the collector to find open
        (a ResourceWarning, an error in whichever test runs when it is collected)."""
        ready = subprocess.run(
            [str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q",
             "-t", "2"],
            check=False, timeout=10,
        )  # fmt: skip
        return ready.returncode == 0

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
