"""The suite's zygote (``tests/support/zygote.py``): a service it forks is a process of its
own, as one ``subprocess.Popen`` starts — its log, environment, working directory, session,
signals and exit codes — and whatever it does not serve is left to ``Popen``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eos_server.parent_watch import PARENT_PID_ENV
from tests.support.nodes import NodeProcess
from tests.support.zygote import ForkedProcess, Zygote

pytestmark = pytest.mark.slow


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    started = Zygote()
    yield started
    started.close()


def test_a_forked_node_serves_logs_and_dies_by_sigkill(
    zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    node = NodeProcess(tmp_path / "node", extra=["--log-level", "info"])
    process = zygote.spawn(node.argv, node.env, node.log_path, True)
    assert isinstance(process, ForkedProcess)
    node.process = process
    try:
        node.wait_ready(60)
        assert httpx.get(f"{node.url}/v1/topics/missing", timeout=5).status_code == 404
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[1]) == zygote.pid  # EOS_PARENT_PID names it
        assert os.readlink(f"/proc/{process.pid}/cwd") == str(tmp_path)
        assert os.getsid(process.pid) == process.pid  # own_session: a session of its own
        assert process.poll() is None
        process.kill()
        assert process.wait(timeout=10) == -signal.SIGKILL
        assert process.poll() == -signal.SIGKILL  # and stays so
        assert "ready" in node.log_path.read_text(), "the service's log is not in its file"
    finally:
        node.kill()


def test_an_exit_code_and_a_wait_that_times_out(zygote: Zygote, tmp_path: Path) -> None:
    """The environment given is the one the service reads: a bad setting in it is the
    service's usage error, exit code 2 as from ``Popen``."""
    bad = NodeProcess(tmp_path / "bad" / "node")
    env = {**bad.env, "EOS_SEGMENT_BYTES": "not-a-number", PARENT_PID_ENV: "1"}
    process = zygote.spawn(bad.argv, env, bad.log_path, False)
    assert process is not None
    assert process.wait(timeout=60) == 2
    assert "segment" in bad.log_path.read_text().lower()

    paused = NodeProcess(tmp_path / "slow" / "node")
    process = zygote.spawn(paused.argv, paused.env, paused.log_path, False)
    assert process is not None
    try:
        with pytest.raises(Exception, match="timed out"):
            process.wait(timeout=0.2)
    finally:
        process.terminate()
        assert process.wait(timeout=30) is not None


def test_anything_but_a_preloaded_service_is_left_to_popen(zygote: Zygote, tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert zygote.spawn([sys.executable, "-m", "http.server"], {}, log, False) is None
    assert zygote.spawn(["python3.9", "-m", "partition_service"], {}, log, False) is None
    assert zygote.spawn([sys.executable, "-c", "pass"], {}, log, False) is None


def test_a_dead_zygote_is_started_again(zygote: Zygote, tmp_path: Path) -> None:
    first = NodeProcess(tmp_path / "a" / "node")
    process = zygote.spawn(first.argv, first.env, first.log_path, False)
    assert process is not None
    process.kill()
    process.wait(timeout=10)
    dead = zygote.pid
    os.kill(dead, signal.SIGKILL)
    second = NodeProcess(tmp_path / "b" / "node")
    second.process = zygote.spawn(second.argv, second.env, second.log_path, False)
    try:
        second.wait_ready(60)
        assert zygote.pid != dead
    finally:
        second.kill()
