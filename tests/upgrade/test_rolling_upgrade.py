"""A rolling upgrade from the previous release (the last one with replication,
``tests/support/releases.py``): three storage nodes and a coordinator of the old release,
a topic of three replicas, an idempotent producer and a transactional one writing all the
time; then one node at a time is stopped and started again with the current release on
the same port and data directory (its on-disk logs read by the new code), each time
waiting until every ISR is full again, and last the coordinator. Nothing acknowledged may
be missing, nothing may appear twice, and every committed transaction must be whole.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest

from eos_cli.launcher import ServiceProcess
from sdk import Consumer, Producer, RecordMetadata, TransactionalProducer
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until
from tests.support.releases import RELEASES, install

pytestmark = pytest.mark.slow

TOPIC = "rolling"


def _run_with(service: ServiceProcess, python: str) -> None:
    """Run ``service`` with another release's interpreter from now on (its flags and its
    environment, the internal token included, stay). ``-P``: the working directory (this
    checkout) never enters the old release's import path."""
    module_at = service.argv.index("-m")
    service.argv = [python, "-P", *service.argv[module_at:]]
    service.env.pop("PYTHONPATH", None)


def _whole(cluster: Cluster) -> bool:
    try:
        states = httpx.get(f"{cluster.url}/v1/topics/{TOPIC}", timeout=5).json()["partitions"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return all(s["leader"]["node_id"] != -1 and len(s["isr"]) == 3 for s in states)


class Writers:
    """An idempotent producer (unique values, acknowledgements kept) and a transactional
    one (one transaction after another, each of six values over the three partitions)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[tuple[str, Future[RecordMetadata]]] = []
        self.committed: list[list[str]] = []
        self.failed_transactions = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._idempotent, daemon=True),
            threading.Thread(target=self._transactional, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _idempotent(self) -> None:
        with Producer(self.url, linger_ms=5) as producer:
            i = 0
            while not self._stop.wait(0.01):
                value = f"i{i}"
                self.sent.append((value, producer.send(TOPIC, value, partition=i % 3)))
                i += 1
            producer.flush()

    def _transactional(self) -> None:
        producer = TransactionalProducer(self.url, "rolling-writer")
        try:
            producer.init_transactions()
            n = 0
            while not self._stop.wait(0.05):
                values = [f"t{n}.{k}" for k in range(6)]
                try:
                    producer.begin_transaction()
                    for k, value in enumerate(values):
                        producer.send(TOPIC, value, partition=k % 3)
                    producer.commit_transaction()
                    self.committed.append(values)
                except Exception:  # an abortable error while a node restarts: abort, go on
                    self.failed_transactions += 1
                    producer.abort_transaction()
                n += 1
        finally:
            producer.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)
            assert not thread.is_alive(), "a writer did not stop"

    def acknowledged(self) -> list[str]:
        return [v for v, f in self.sent if f.done() and f.exception() is None]


def _read_all(url: str) -> list[str]:
    values: list[str] = []
    with Consumer(url, max_poll_records=2000) as consumer:
        consumer.assign([(TOPIC, p) for p in range(3)])
        for p in range(3):
            consumer.seek((TOPIC, p), 0)
        idle = 0
        while idle < 5:
            records = consumer.poll(timeout=1.0)
            values += [str(r.value) for r in records]
            idle = 0 if records else idle + 1
    return values


def test_rolling_upgrade_of_the_storage_nodes(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    previous = install([r for r in RELEASES if r.replication][-1])
    cluster = cluster_factory(nodes=3, replication_factor=3, fsync=True, start=False)
    for service in [*cluster.nodes, *cluster.coordinators]:
        _run_with(service, previous.python)
    cluster.start()
    httpx.post(f"{cluster.url}/v1/topics", json={"name": TOPIC, "partitions": 3},
               timeout=30).raise_for_status()  # fmt: skip
    wait_until(lambda: _whole(cluster), timeout=60, what="every replica in sync")
    writers = Writers(cluster.url)
    try:
        for n in (1, 2, 3):
            before, txns = len(writers.acknowledged()), len(writers.committed)
            node = cluster.node(n)
            node.stop()
            _run_with(node, sys.executable)
            cluster.start_node(n)
            wait_until(lambda: _whole(cluster), timeout=90,
                       what=f"every ISR full after node {n} was upgraded")  # fmt: skip
            wait_until(lambda b=before: len(writers.acknowledged()) > b + 50, timeout=60,
                       what=f"writes acknowledged across node {n}'s upgrade")  # fmt: skip
            wait_until(lambda t=txns: len(writers.committed) > t + 1, timeout=60,
                       what=f"transactions committed across node {n}'s upgrade")  # fmt: skip
        coordinator = cluster.coordinators[0]
        coordinator.stop()
        _run_with(coordinator, sys.executable)
        cluster.start_coordinator(0)
        done = len(writers.committed)
        wait_until(lambda: len(writers.committed) > done + 3, timeout=60,
                   what="transactions committed by the upgraded coordinator")  # fmt: skip
    finally:
        writers.stop()
    acknowledged = writers.acknowledged()
    values = _read_all(cluster.url)
    assert len(values) == len(set(values)), "a value appears twice"
    missing = set(acknowledged) - set(values)
    assert not missing, f"{len(missing)} acknowledged records lost: {sorted(missing)[:10]}"
    partial = [txn for txn in writers.committed if not set(txn) <= set(values)]
    assert not partial, f"committed transactions not whole: {partial[:3]}"
