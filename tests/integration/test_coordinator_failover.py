"""No coordinator is a single point of failure.

Two coordinators on one PostgreSQL database with 2 s leases; the storage nodes are started
with the first coordinator only and the clients bootstrapped on the second only (the
set-up that used to stall every transaction once the first one died: every new
transaction's first batch waited on a verification that only the dead coordinator was
asked). The first coordinator also owns the producer's transactional id (the two share
the leases evenly). It is SIGKILLed, or SIGSTOPped (a
paused process keeps its sockets open, so only a timeout reveals it), and transactions
must commit again within the lease time plus one second, with the stopped one still down.

Also: a service given an address or token it could never use refuses to start, with a
message naming the setting.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sdk import Consumer, RetryConfig, TopicPartition, TransactionalProducer
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.leases import tid_owned_by, wait_balanced
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import ServiceProcess, free_port, wait_until

LEASE_MS = 2_000
TIMEOUT_MS = 1_000
#: What a machine running the whole suite may add to a failover (both cores busy).
LOADED_MACHINE_S = 3.0


@pytest.fixture
def two_coordinators(cluster_factory: ClusterFactory) -> Cluster:
    """The nodes verify with the first coordinator alone; the leases are shared evenly
    between the two before the test begins."""
    cluster = cluster_factory(
        database="postgres", coordinators=2, entry=0, lease_ms=LEASE_MS,
        coordinator_timeout_ms=TIMEOUT_MS, fast_loops=False,
    )
    wait_balanced(cluster.coordinators)
    return cluster


def _known_coordinators(node: ServiceProcess) -> float:
    for line in httpx.get(f"{node.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("eos_node_known_coordinators "):
            return float(line.split()[1])
    return 0.0


def _commit_one(producer: TransactionalProducer, topic: str, value: str) -> None:
    producer.begin_transaction()
    for partition in (0, 1, 2, 3):
        producer.send(topic, value, partition=partition)
    producer.commit_transaction()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_transactions_commit_again_after_the_configured_coordinator_stops(
    two_coordinators: Cluster, how: str
) -> None:
    first, second = two_coordinators.coordinators
    httpx.post(
        f"{second.url}/v1/topics", json={"name": "orders", "partitions": 4}, timeout=30
    ).raise_for_status()
    wait_until(
        lambda: all(_known_coordinators(n) >= 2 for n in two_coordinators.nodes),
        timeout=30, what="the nodes to learn the second coordinator",
    )  # fmt: skip
    loader = tid_owned_by(first, "loader")

    retry = RetryConfig(coordinator_timeout_ms=TIMEOUT_MS)
    producer = TransactionalProducer(second.url, loader, retry=retry)
    try:
        producer.init_transactions()
        _commit_one(producer, "orders", "before")
        if how == "SIGKILL":
            first.kill()
        else:
            first.pause()
        stopped = time.monotonic()
        _commit_one(producer, "orders", "after")
        window = time.monotonic() - stopped
        _commit_one(producer, "orders", "later")
    finally:
        producer.close(timeout=5)
        if how == "SIGSTOP":
            first.resume()

    print(f"{how}: first commit {window:.2f} s after the coordinator stopped")
    # The lease, the node's add attempt in flight to the paused owner (transaction
    # version 2: the add must reach the owner), the client's commit attempt; a dead owner
    # refuses at once and costs no attempt. Measured alone: 1.4-1.7 s (SIGKILL), 3.2-4.4 s
    # (SIGSTOP) (docs/availability.md). The margin is for the suite's own load (four
    # workers on two cores: 5.15 s was seen once with 1 s): what this test guards against
    # is a stall of the 30 s request timeout, not a second.
    attempts = 2 if how == "SIGSTOP" else 1
    bound = LEASE_MS / 1000 + attempts * TIMEOUT_MS / 1000 + LOADED_MACHINE_S
    assert window < bound, (window, bound)
    with Consumer(second.url, isolation_level="read_committed") as consumer:
        tps = [TopicPartition("orders", p) for p in range(4)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while len(seen) < 12 and time.monotonic() < deadline:
            seen += [str(r.value) for r in consumer.poll(timeout=0.5)]
    assert sorted(seen) == sorted(["before"] * 4 + ["after"] * 4 + ["later"] * 4)


def _refuses(module: str, args: list[str], *expected: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--coordinator-url", "http://a:1 http://b:2"], ["--coordinator-url", "not one URL"]),
        (["--coordinator-url", "http://a:1,ftp://b:2"], ["--coordinator-url", "'ftp'"]),
        (["--coordinator-url", "http://a:99999"], ["--coordinator-url", "not a valid URL"]),
        (["--internal-token", "short"], ["--internal-token", "at least 32 characters"]),
    ],
)
def test_a_node_refuses_to_start_with_an_unusable_setting(
    tmp_path: Path, args: list[str], expected: list[str]
) -> None:
    token = [] if "--internal-token" in args else ["--internal-token", INTERNAL_TOKEN]
    port = ["--port", str(free_port()), "--data-dir", str(tmp_path / "n")]
    _refuses("partition_service", [*port, *token, *args], *expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--nodes", "1=localhost:9091"], ["--nodes", "storage node 1"]),
        (["--nodes", "1=http://a:1,1=http://b:1"], ["--nodes", "named twice"]),
        (["--public-url", "http://a:1,http://b:2"], ["--public-url", "not one URL"]),
        (["--internal-token", "x" * 31], ["--internal-token", "at least 32 characters"]),
    ],
)
def test_a_coordinator_refuses_to_start_with_an_unusable_setting(
    tmp_path: Path, args: list[str], expected: list[str]
) -> None:
    base = ["--port", str(free_port()), "--data-dir", str(tmp_path / "c")]
    _refuses("coordinator_service", [*base, *args], *expected)
