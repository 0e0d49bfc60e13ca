"""The launcher's ``ServiceProcess.start``: a service that never becomes ready is stopped
and reaped before the error is raised, so a failed start leaves no process behind (holding
its port, or found running by the collector in a later test as a ``ResourceWarning``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eos_cli.launcher import ServiceError, ServiceProcess, free_port


def test_a_service_that_never_becomes_ready_is_stopped_and_reaped(tmp_path: Path) -> None:
    never_ready = ServiceProcess(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        port=free_port(),
        log_path=tmp_path / "sleeper.log",
    )
    with pytest.raises(ServiceError, match="not ready after 1s"):
        never_ready.start(timeout=1.0)
    assert never_ready.process is not None
    assert never_ready.process.returncode is not None  # reaped, not left running
    assert not never_ready.alive()


def test_a_ready_service_is_left_running(tmp_path: Path) -> None:
    port = free_port()
    server = ServiceProcess(
        "http",
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        port=port,
        log_path=tmp_path / "http.log",
        ready_path="/",
    )
    try:
        server.start(timeout=30.0)
        assert server.alive()
    finally:
        server.stop()
    assert not server.alive()
