"""Shared pieces of the benchmarks: a keep-alive HTTP/1.1 connection to a local service
and child processes timed from start to ready.

The load comes through the services' own internal client (``eos_server.keepalive``), not
a general-purpose one: httpx spends more CPU per request than the services it would
measure, and ``bench/bench_internal_client.py`` measures by how much. Each ``Conn`` keeps
one connection, so a load loop on it sends its requests one after another.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from eos_server.keepalive import KeepAliveClient

TOKEN = "bench-internal-token-0123456789abcdef"
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Long enough for every request a benchmark sends (commits waiting for their markers,
#: long-polled fetches, batches of a million records).
REQUEST_TIMEOUT_S = 300.0

_JSON = {"content-type": "application/json"}


class HttpError(Exception):
    pass


class Conn:
    """One keep-alive connection to a service on this machine; requests on it are sequential.

    A ``KeepAliveClient`` with room for one idle connection: it connects on the first
    request and keeps that connection (reconnecting, once, if the service closed it)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._base = f"http://127.0.0.1:{port}"
        self._client = KeepAliveClient(timeout_s=REQUEST_TIMEOUT_S, max_idle_per_host=1)

    async def open(self) -> Conn:
        """The connection opens with the first request (in a load run, a warm-up one)."""
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] = _JSON
    ) -> tuple[int, bytes]:
        """(status, body) of ``method path``; the body is sent as JSON."""
        if headers is not _JSON:
            headers = {**_JSON, **headers}
        return await self._client.request(method, self._base + path, body, headers)

    async def close(self) -> None:
        await self._client.close()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def call(port: int, method: str, path: str, body: Any = None, internal: bool = False) -> Any:
    conn = Conn(port)
    try:
        data = b"" if body is None else orjson.dumps(body)
        status, answer = await conn.request(method, path, data, bearer(TOKEN) if internal else {})
    finally:
        await conn.close()
    if status >= 300:
        raise HttpError(f"{method} {path}: {status} {answer[:300]!r}")
    return orjson.loads(answer) if answer else None


async def metric(port: int, name: str, labels: str) -> float:
    conn = Conn(port)
    try:
        _status, text = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    prefix = f"{name}{{{labels}}} ".encode()
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise HttpError(f"metric {name}{{{labels}}} not found")


# -- processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    proc: subprocess.Popen[bytes], port: int, started: float, timeout: float = 60.0
) -> float:
    """Seconds from ``started`` until GET /readyz answers 200 (polled every millisecond)."""
    request = b"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it was ready")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(request)
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > timeout:
            raise RuntimeError("not ready in time")
        time.sleep(0.001)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Server:
    """A node (or the no-op server) as a child process."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.argv = argv
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start and wait until ready; returns seconds from the start of the process."""
        with self.log.open("ab") as log:
            started = time.monotonic()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log)
        try:
            return wait_ready(self.proc, self.port, started)
        except RuntimeError as exc:
            self.kill()
            tail = self.log.read_bytes()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{self.argv[1:3]}: {exc}\n{tail}") from None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """Clean stop (SIGTERM: the node flushes and checkpoints)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
