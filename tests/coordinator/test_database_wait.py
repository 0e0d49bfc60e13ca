"""A coordinator started before its database waits for it (services of a deployment start in
any order), and one whose database never comes says so in one line and exits 1."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import sqlalchemy as sa

from coordinator_service.app import create_app
from tests.support.children import Children
from tests.support.coordinators import (
    coordinator_settings,
    create_database,
    drop_database,
    open_connections,
)
from tests.support.processes import free_port, wait_until


def _coordinator(
    children: Children, database_url: str, wait_ms: int, log: Path
) -> subprocess.Popen[bytes]:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "eos_cli.entry",
        "coordinator",
        "--port",
        str(port),
        "--database-url",
        database_url,
        "--database-wait-ms",
        str(wait_ms),
        "--internal-token",
        secrets.token_hex(24),
        "--public-url",
        f"http://127.0.0.1:{port}",
    ]
    process = children.start(args, log=log)
    process.port = port  # type: ignore[attr-defined]
    return process


@contextmanager
def _forwarder(listen_port: int, target: tuple[str, int]) -> Iterator[None]:
    """A TCP forwarder from ``listen_port`` to ``target``: the database "appearing"."""
    server = socket.create_server(("127.0.0.1", listen_port))
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(target)
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        server.close()


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] if ":" in parts.netloc.split("@")[-1] else parts.netloc
    return urlunsplit(parts._replace(netloc=f"{netloc}:{port}"))


def test_a_coordinator_waits_for_a_database_that_comes_later(
    pg_url: str, tmp_path: Path, children: Children
) -> None:
    real = urlsplit(pg_url)
    late_port = free_port()
    log = tmp_path / "coordinator.log"
    process = _coordinator(children, _with_port(pg_url, late_port), 60_000, log)
    wait_until(lambda: "not reachable yet" in log.read_text(), timeout=20, what="a waiting line")
    assert process.poll() is None, "the coordinator gave up instead of waiting"
    with _forwarder(late_port, (real.hostname or "127.0.0.1", real.port or 5432)):
        url = f"http://127.0.0.1:{process.port}/readyz"  # type: ignore[attr-defined]

        def ready() -> bool:
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=60, what="the coordinator to become ready")
        text = log.read_text()
        assert "is reachable" in text
        assert "Traceback" not in text
        children.stop(process)  # before the forwarder goes: a clean stop, not a lost database


def test_a_database_that_never_comes_ends_the_start_in_one_line(
    tmp_path: Path, children: Children
) -> None:
    dead = f"postgresql+psycopg://eos:s3cret-password@127.0.0.1:{free_port()}/eos"
    log = tmp_path / "coordinator.log"
    process = _coordinator(children, dead, 1500, log)
    assert process.wait(timeout=60) == 1
    text = log.read_text()
    assert "coordinator cannot start: database" in text and "not reachable within 1500 ms" in text
    assert "s3cret-password" not in text, "the password must not reach the logs"
    assert "Traceback" not in text
    assert os.path.getsize(log) < 10_000


def test_a_start_that_fails_leaves_no_database_connection_open() -> None:
    """A database that answers but is not migrated (``--migrate-on-start`` off) fails the
    start after the engine made its first connection: that connection is closed with the
    failure, not left open in the pool for the collector."""
    name, url = create_database()
    try:
        settings = coordinator_settings(url, "1=http://127.0.0.1:9", migrate_on_start=False)
        app = create_app(settings, background=False)

        async def start() -> None:
            async with app.router.lifespan_context(app):
                pass

        with pytest.raises(sa.exc.ProgrammingError):
            asyncio.run(start())
        assert open_connections(name) == 0
    finally:
        drop_database(name)
