"""Upgrades from real earlier releases (``tests/support/releases.py``), as their users
would do them: the old release's ``eos up`` (with authentication) writes a topic,
committed and aborted transactions, group offsets (transactional and plain), an ACL and a
second principal's token through the old SDK and CLI; it is stopped; the current release
starts on the same data directory — SQLite migrated by the coordinator at start, or
PostgreSQL migrated first with ``eos db upgrade`` — and every record, offset, ACL, token
and the transactional id are checked, and a new transaction goes on with the old id.

Neighbouring versions meet both ways: the current SDK runs a transaction against the old
cluster before the upgrade, and the old SDK (``old_client.py``, run by the old release's
Python) runs one against the new cluster after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from eos_protocol.coordinator import TransactionDescription
from sdk import AdminClient, Consumer, TransactionalProducer
from tests.support.children import Children
from tests.support.coordinators import temp_database
from tests.support.processes import free_port_base, wait_until
from tests.support.releases import RELEASES, InstalledRelease, Release, install

pytestmark = pytest.mark.slow

OLD_CLIENT = Path(__file__).with_name("old_client.py")


class Up:
    """One release's ``eos up``, started as a child of the test (``children``: stopped and
    reaped at the end whatever happens), its output in a shared log."""

    def __init__(self, children: Children, log: Path, cwd: Path) -> None:
        self.children, self.log, self.cwd = children, log, cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], env: dict[str, str] | None, timeout: float = 120) -> None:
        start = self.log.stat().st_size if self.log.exists() else 0
        self.process = self.children.start(argv, log=self.log, cwd=self.cwd, env=env)

        def ready() -> bool:
            assert self.process is not None
            text = self.log.read_bytes()[start:].decode(errors="replace")
            assert self.process.poll() is None, f"eos up exited:\n{text[-4000:]}"
            return "cluster ready" in text

        wait_until(ready, timeout=timeout, interval=0.2, what=f"{argv[:4]} to be ready")

    def stop(self) -> None:
        """SIGTERM: ``eos up`` stops its services and exits."""
        assert self.process is not None
        self.children.stop(self.process, grace_s=60)


@contextmanager
def database(kind: str) -> Iterator[str | None]:
    if kind == "sqlite":
        yield None
        return
    with temp_database() as url:
        yield url


def old_client(release: InstalledRelease, cwd: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [release.python, str(OLD_CLIENT), *args],
        capture_output=True, text=True, cwd=cwd, env=release.env(), timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, f"the {release.release.version} client failed:\n{out.stderr}"
    answer: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return answer


def current(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eos_cli.main", *args],
        capture_output=True, text=True, cwd=cwd, timeout=180,
    )  # fmt: skip


def read_committed(
    url: str, token: str, topic: str, partitions: int, expected: Iterable[str]
) -> dict[int, list[str]]:
    """Every partition read read_committed from offset 0 until each ``expected`` value has
    been seen (a restarted cluster elects its leaders and moves its high watermarks up a
    moment after it answers), by partition in offset order."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    wanted = set(expected)
    with Consumer(url, token=token, max_poll_records=1000) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.seek((topic, p), 0)

        def done() -> bool:
            for record in consumer.poll(timeout=0.5):
                found[record.partition].append(str(record.value))
            return wanted <= {v for values in found.values() for v in values}

        wait_until(done, timeout=90, interval=0, what=f"{len(wanted)} values in {topic}")
    return found


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_upgrade_from_an_earlier_release(
    release: Release, kind: str, tmp_path: Path, children: Children
) -> None:
    old = install(release)
    data = tmp_path / "data"
    base = free_port_base()
    url = f"http://127.0.0.1:{base}"
    up = Up(children, tmp_path / "up.log", tmp_path)
    with database(kind) as database_url:
        db = ["--database-url", database_url] if database_url else []
        up_args = ["up", "--data-dir", str(data), "--port-base", str(base), "--auth", *db]

        up.start(old.command(*up_args), old.env())  # the earlier release
        token = (data / "admin-token").read_text().strip()
        wrote = old_client(old, tmp_path, "write", url, token)
        made = subprocess.run(
            old.command("auth", "new-token", "--principal", wrote["reader"],
                        "--tokens-file", str(data / "tokens.toml")),
            capture_output=True, text=True, cwd=tmp_path, env=old.env(), timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        reader_token = made.stdout.strip().splitlines()[-1]
        # the current SDK against the old cluster
        _transact(url, token, wrote["topic"], "new-client-on-old-cluster")
        with AdminClient(url, token=token) as admin:
            before = admin.describe_transaction(wrote["transactional_id"])
        up.stop()

        if database_url:
            migrated = current("db", "upgrade", "--database-url", database_url, cwd=tmp_path)
            assert migrated.returncode == 0, migrated.stderr
        up.start([sys.executable, "-m", "eos_cli.main", *up_args], None)  # this release
        _check_upgraded(url, token, reader_token, wrote, before)
        # the old SDK against the new cluster
        answer = old_client(old, tmp_path, "transact", url, token, "old-client-on-new")
        assert answer["read"] == answer["written"]
        up.stop()


def _transact(url: str, token: str, topic: str, transactional_id: str) -> None:
    values = [f"{transactional_id}-{i}" for i in range(10)]
    with TransactionalProducer(url, transactional_id, token=token) as producer:
        producer.init_transactions()
        with producer.transaction():
            for value in values:
                producer.send(topic, value, partition=1)
    read = read_committed(url, token, topic, 3, values)[1]
    assert [v for v in read if v in values] == values


def _check_upgraded(
    url: str, token: str, reader_token: str, wrote: dict[str, Any], before: TransactionDescription
) -> None:
    topic = wrote["topic"]
    every_committed = [v for values in wrote["committed"].values() for v in values]
    read = read_committed(url, token, topic, 3, every_committed)
    for p, values in wrote["committed"].items():
        assert [v for v in read[int(p)] if v.startswith("t")] == values, f"partition {p}"
    everything = {v for values in read.values() for v in values}
    assert not everything & set(wrote["aborted"]), "aborted records shown read_committed"
    for group, offsets in wrote["group_offsets"].items():
        with Consumer(url, group, token=token) as consumer:
            committed = consumer.committed([(topic, int(p)) for p in offsets])
        assert {tp.partition: o.offset for tp, o in committed.items() if o} == {
            int(p): o for p, o in offsets.items()
        }, group
    with AdminClient(url, token=token) as admin:
        acls = admin.list_acls(principal=wrote["reader"])
    assert [(a.resource_name, a.operation.value) for a in acls] == [(topic, "read")]
    # the second principal's token and ACL still admit it (and only to read)
    first = wrote["committed"]["0"][:3]
    assert read_committed(url, reader_token, topic, 3, first)[0][:3] == first
    # the transactional id kept its producer id and epoch, and goes on past that epoch
    tid = wrote["transactional_id"]
    with AdminClient(url, token=token) as admin:
        kept = admin.describe_transaction(tid)
    assert (kept.producer_id, kept.producer_epoch, kept.state) == (
        before.producer_id, before.producer_epoch, before.state,
    )  # fmt: skip
    with TransactionalProducer(url, tid, token=token) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send(topic, "after the upgrade", partition=2)
    with AdminClient(url, token=token) as admin:
        after = admin.describe_transaction(tid)
    assert after.producer_epoch > before.producer_epoch or after.producer_id != before.producer_id
    assert read_committed(url, token, topic, 3, ["after the upgrade"])[2][-1] == "after the upgrade"
