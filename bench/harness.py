"""Shared pieces of the benchmarks: a minimal keep-alive HTTP/1.1 client and child
processes timed from start to ready.

The client exists because a general-purpose one (httpx) spends more CPU per request than
the services it would measure; this one costs tens of microseconds, so the figures are the
services' and not the load generator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

TOKEN = "bench-internal-token-0123456789abcdef"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- a minimal HTTP/1.1 keep-alive client ----------------------------------------------------
class HttpError(Exception):
    pass


class Conn:
    """One keep-alive connection; requests on it are sequential."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.port, limit=1 << 20
        )
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{headers}"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.writelines([head, body] if body else [head])
        await self.writer.drain()
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value.strip())
            elif lname == b"transfer-encoding":
                raise HttpError("chunked answers are not supported by this client")
        if length < 0:
            raise HttpError("answer without content-length")
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()


async def call(port: int, method: str, path: str, body: Any = None, internal: bool = False) -> Any:
    conn = await Conn(port).open()
    try:
        data = b"" if body is None else orjson.dumps(body)
        headers = f"authorization: Bearer {TOKEN}\r\n" if internal else ""
        status, answer = await conn.request(method, path, data, headers)
    finally:
        await conn.close()
    if status >= 300:
        raise HttpError(f"{method} {path}: {status} {answer[:300]!r}")
    return orjson.loads(answer) if answer else None


async def metric(port: int, name: str, labels: str) -> float:
    conn = await Conn(port).open()
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
