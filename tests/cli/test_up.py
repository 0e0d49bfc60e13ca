"""``eos up`` as a real subprocess: driven through the CLI and the SDK, stopped with
SIGTERM, started again with its data intact. CLI errors print the code, no traceback."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk import Consumer, TransactionalProducer
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def free_base() -> int:
    while True:
        base = random.randrange(20_000, 32_000, 100)  # below the ephemeral range
        if all(port_free(base + offset) for offset in (0, 1, 11, 12, 13)):
            return base


def eos(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eos_cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


class Up:
    def __init__(self, data_dir: Path, base: int) -> None:
        self.data_dir, self.base = data_dir, base
        self.log = data_dir.parent / "up.out"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"http://127.0.0.1:{self.base}"

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eos_cli.main",
                    "up",
                    "--data-dir",
                    str(self.data_dir),
                    "--port-base",
                    str(self.base),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text()
            return "cluster ready" in self.log.read_text()

        wait_until(ready, timeout=90, what="eos up to print 'cluster ready'")

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    cluster = Up(tmp_path / "data", free_base())
    yield cluster
    if cluster.process is not None and cluster.process.poll() is None:
        cluster.stop()


def test_up_cli_sdk_restart(up: Up) -> None:
    up.start()
    lines = up.log.read_text().splitlines()
    assert sum(line.startswith("node ") for line in lines) == 3
    assert any(line.startswith("coordinator 1") and up.bootstrap in line for line in lines)
    b = ("--bootstrap", up.bootstrap)

    assert eos("topics", "create", "events", "--partitions", "3", *b).returncode == 0
    produced = eos(
        "produce", "events", "--transactional-id", "cli-loader", *b, stdin="one\ntwo\nthree\n"
    )
    assert produced.returncode == 0, produced.stderr
    with TransactionalProducer(up.bootstrap, "sdk-writer") as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send("events", "four", partition=0)
        producer.begin_transaction()
        producer.send("events", "aborted", partition=1)
        producer.flush()
        producer.abort_transaction()
    consumed = eos("consume", "events", "--from-beginning", "--idle-timeout", "2", *b)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["four", "one", "three", "two"]

    missing = eos("transactions", "describe", "nobody", *b)
    assert missing.returncode == 1
    assert "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr and "Traceback" not in missing.stderr
    duplicate = eos("topics", "create", "events", *b)
    assert duplicate.returncode == 1 and "TOPIC_ALREADY_EXISTS" in duplicate.stderr

    assert up.stop() == 0
    assert "cluster stopped" in up.log.read_text()
    for port in (up.base, up.base + 11, up.base + 12, up.base + 13):
        assert port_free(port), f"port {port} still in use after SIGTERM"

    up.start()
    listed = eos("transactions", "list", *b)
    assert "cli-loader" in listed.stdout and "CompleteCommit" in listed.stdout
    with Consumer(up.bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([("events", p) for p in range(3)])
        seen: list[str] = []

        def everything() -> bool:
            seen.extend(str(r.value) for r in consumer.poll(timeout=0.5))
            return len(seen) >= 4

        wait_until(everything, timeout=30, what="the records written before the restart")
    assert sorted(seen) == ["four", "one", "three", "two"]


def test_several_coordinators_need_postgresql(tmp_path: Path) -> None:
    refused = eos("up", "--coordinators", "2", "--data-dir", str(tmp_path / "d"))
    assert refused.returncode == 2
    assert "PostgreSQL" in refused.stderr


def test_up_with_two_coordinators_on_postgresql_and_auth_on(tmp_path: Path) -> None:
    from tests.support.coordinators import temp_database

    base = free_base()
    with temp_database() as url:
        log = tmp_path / "up.out"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eos_cli.main",
                    "up",
                    "--data-dir",
                    str(tmp_path / "d"),
                    "--port-base",
                    str(base),
                    "--coordinators",
                    "2",
                    "--nodes",
                    "2",
                    "--database-url",
                    url,
                    "--auth",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:

            def ready() -> bool:
                if process.poll() is not None:
                    logs = "\n".join(
                        f"--- {p.name}\n{p.read_text()[-2000:]}"
                        for p in sorted((tmp_path / "d" / "logs").glob("*.log"))
                    )
                    raise AssertionError(f"eos up exited:\n{log.read_text()}\n{logs}")
                return "cluster ready" in log.read_text()

            wait_until(
                ready,
                timeout=150,
                what="two coordinators and two nodes",
            )
            text = log.read_text()
            assert "coordinator 2" in text and f"127.0.0.1:{base + 1}" in text
            assert "auth on: export EOS_TOKEN" in text
            token = (tmp_path / "d" / "admin-token").read_text().strip()
            assert token not in (tmp_path / "d" / "tokens.toml").read_text()
            for port in (base, base + 1):
                bootstrap = ["--bootstrap", f"http://127.0.0.1:{port}"]
                refused = eos("topics", "list", *bootstrap)
                assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
                listed = eos("--token", token, "topics", "list", *bootstrap)
                assert listed.returncode == 0 and "__consumer_offsets" in listed.stdout
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
