"""The local session's Python workers fork from ``spark_jobs.worker_daemon``, which imported
the SDK and the data source before its first fork, and started no thread doing so; its
SIGKILLs reach its own children only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.children import Children

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def test_a_local_sessions_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "spark_jobs.worker_daemon"

    def where(_rows: Any) -> Any:
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            yield (cmdline.read().replace(b"\0", b" ").decode(), "sdk" in sys.modules)

    found = spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect()
    assert found and all("spark_jobs.worker_daemon" in parent for parent, _ in found), found
    assert all(preloaded for _, preloaded in found), found


def test_the_daemon_imports_start_no_thread_and_leave_pyarrow_to_the_workers() -> None:
    """A fork copies the forking thread alone, and pyarrow may start threads on import."""
    code = (
        "import sys, threading; import spark_jobs.worker_daemon; "
        "print(threading.active_count(), 'pyarrow' in sys.modules, 'sdk' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False", "True"], out.stdout + out.stderr


def test_the_daemon_sigkills_only_its_own_children(children: Children) -> None:
    """The JVM may name a worker the daemon reaped long ago, whose pid is now another
    process's: that process lives on; a child of the daemon's is killed."""
    from spark_jobs.worker_daemon import _OwnWorkersOnly, is_child

    guarded = _OwnWorkersOnly()
    shell = children.start(["sh", "-c", "sleep 60 & echo $!; wait"], start_new_session=True,
                           stdout=subprocess.PIPE)  # fmt: skip
    assert shell.stdout is not None
    with shell.stdout:
        grandchild = int(shell.stdout.readline())  # alive, and not this process's child
    assert is_child(shell.pid) and not is_child(grandchild)
    with pytest.raises(ProcessLookupError):
        guarded.kill(grandchild, signal.SIGKILL)
    assert Path(f"/proc/{grandchild}").exists()
    guarded.kill(shell.pid, signal.SIGKILL)
    os.killpg(shell.pid, signal.SIGKILL)  # the sleep, which no test may leave behind
    assert shell.wait(timeout=10) == -signal.SIGKILL
    guarded.kill(0, 0)  # signals to the group pass as before (``shutdown``'s SIGHUP)
