"""``eos coordinator --instances K``: K coordinator processes from one command, sharing
the database and the transaction-log partitions, supervised (real processes, real
PostgreSQL, real SIGKILL and SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.support.children import Children
from tests.support.coordinators import temp_database
from tests.support.leases import wait_balanced
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import free_port, free_port_base, wait_until

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Instance:
    url: str


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def _listening_pid(port: int, parent: int) -> int:
    """The child serving ``port`` (its command line names the port)."""
    for pid in _children(parent):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone since it was listed (the killed child, reaped meanwhile)
        if b"--port" in argv and argv[argv.index(b"--port") + 1] == str(port).encode():
            return pid
    raise AssertionError(f"no child serves port {port}")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_instances_share_the_partitions_restart_and_release_them(
    tmp_path: Path, children: Children
) -> None:
    base = free_port_base(offsets=(0, 1))
    output = tmp_path / "group.out"
    with temp_database() as url:
        group = children.start(
            [sys.executable, "-m", "coordinator_service", "--instances", "2",
             "--port", str(base), "--database-url", url, "--lease-ms", "2000",
             "--internal-token", INTERNAL_TOKEN, "--data-dir", str(tmp_path)],
            log=output,
        )  # fmt: skip
        instances = [Instance(f"http://127.0.0.1:{base + i}") for i in range(2)]

        def said() -> str:
            return output.read_text(errors="replace")

        # The group supervises once its first start is over (it says so): a child that
        # dies before then is a failed start, reported and not restarted.
        wait_until(lambda: "2 coordinator instances ready" in said(), timeout=60,
                   what="the group to say both instances are ready")
        wait_until(lambda: all(_ready(i.url) for i in instances), timeout=30,
                   what="both instances ready")
        assert wait_balanced(instances) == [25, 25]
        # One instance killed: the group starts it again under the same instance id; its
        # partitions are owned again (taken back by the restarted one, or by the survivor
        # if their leases ran out first), and the shares even out once more.
        victim = _listening_pid(base + 1, group.pid)
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        try:
            wait_until(lambda: _listening_pid_or_0(base + 1, group.pid) not in (0, victim),
                       timeout=20, what="the killed instance to be started again")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the group said:\n{said()}") from None
        assert "coordinator-1 (pid" in said() and "restarting it in" in said(), said()
        assert wait_balanced(instances, timeout=40) == [25, 25]
        returncode = children.stop(group, grace_s=60)  # SIGTERM: a clean stop
        out = said()
        assert returncode == 0, out
        assert "coordinator instances stopped" in out
        assert not _children(group.pid)
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                live = conn.execute(sa.text(
                    "SELECT count(*) FROM leases WHERE log_partition >= 0 AND expires_at_ms > 0"
                )).scalar()
        finally:
            engine.dispose()
        assert live == 0, "a clean stop releases every lease"


def _listening_pid_or_0(port: int, parent: int) -> int:
    try:
        return _listening_pid(port, parent)
    except AssertionError:
        return 0


def test_several_instances_need_postgresql(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "coordinator_service", "--instances", "3",
         "--port", str(free_port()), "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--instances above 1 needs a shared PostgreSQL --database-url" in result.stderr
    assert "Traceback" not in result.stderr
