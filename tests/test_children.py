"""The ``children`` fixture's stopper (``tests/support/children.py``): every process is
stopped and reaped, a process group with its leader, and one that ignores SIGTERM is
killed once the grace runs out."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.children import Children
from tests.support.processes import wait_until


def _ignores_term(ready: Path) -> list[str]:
    code = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(60)")  # fmt: skip
    return [sys.executable, "-c", code, str(ready)]


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its (init) parent."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_close_stops_and_reaps_every_child_and_its_group(tmp_path: Path) -> None:
    children = Children(grace_s=1)
    plain = children.start([sys.executable, "-c", "import time; time.sleep(60)"])
    pidfile, ready = tmp_path / "grandchild", tmp_path / "ready"
    group = children.start(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait"],
        start_new_session=True,
    )
    stubborn = children.start(_ignores_term(ready))
    wait_until(lambda: pidfile.exists() and ready.exists(), timeout=30,
               what="the grandchild started and the handler installed")  # fmt: skip
    grandchild = int(pidfile.read_text())
    children.close()
    assert plain.returncode == -15 and group.returncode is not None
    assert stubborn.returncode == -9  # SIGTERM ignored: killed after the grace
    wait_until(lambda: _gone(grandchild), timeout=10, what="the group's grandchild to go")


def test_stop_waits_for_a_clean_exit() -> None:
    children = Children()
    process = children.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert children.stop(process, grace_s=10) == -15  # SIGTERM was enough
    children.close()  # nothing left: a no-op
