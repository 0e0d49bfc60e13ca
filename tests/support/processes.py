"""Real service processes on loopback ports for tests: start, wait ready, SIGKILL, stop."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A free loopback port below 32000, outside the kernel's ephemeral range (32768 and
    up): a port from that range may be taken as the source port of some outgoing
    connection while the service that owned it is down, and a killed service must come
    back on its own port."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(12_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below 32000")


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``condition`` until it holds; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ServiceProcess:
    """A service started as ``python -m <module> <args>`` with its log in a file."""

    scheme = "http"  # "https" for a service given --tls-cert/--tls-key
    verify: Any = True  # what httpx verifies an https service against

    def __init__(
        self,
        module: str,
        args: list[str],
        port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.module = module
        self.args = args
        self.port = port
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, *, ready_path: str = "/readyz", timeout: float = 30.0) -> ServiceProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        log.close()
        self.wait_ready(ready_path, timeout)
        return self

    def wait_ready(self, path: str = "/readyz", timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.module} exited with {self.process.returncode}:\n{self.tail()}"
                )
            try:
                answer = httpx.get(self.url + path, timeout=1.0, verify=self.verify)
                return answer.status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=timeout, what=f"{self.module} on port {self.port}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint, no goodbye."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit (SIGKILL if it hangs)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
