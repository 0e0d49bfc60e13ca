"""Leases move while transactions run: a coordinator joins, then the first one leaves, and
producers committing all the while never see an error and write every record exactly once.

Two coordinators on one PostgreSQL database, two nodes. The second coordinator is stopped
before the load starts, so the first holds every log partition; it is started again under
load (half the partitions are handed to it), then the first is stopped cleanly (it hands
everything back by releasing). The producers follow ``NOT_COORDINATOR`` on their own."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from sdk import Consumer, TopicPartition, TransactionalProducer
from tests.support.cluster import ClusterFactory
from tests.support.leases import owned_partitions, wait_balanced
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

PRODUCERS = 6
PARTITIONS = 4


def _handoffs(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("eos_coordinator_lease_handoffs_total "):
            return float(line.split()[1])
    return 0.0


def test_transactions_ride_through_a_join_and_a_leave(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(database="postgres", coordinators=2, lease_ms=3000,
                              fast_loops=False)  # fmt: skip
    first, second = cluster.coordinators
    second.stop()
    wait_until(lambda: owned_partitions(first) == 50, timeout=15, what="first holds all")
    topic = cluster.create_topic(PARTITIONS, "rebalance")

    stop = threading.Event()
    committed: dict[int, list[str]] = {i: [] for i in range(PRODUCERS)}
    errors: list[BaseException] = []

    def produce(i: int) -> None:
        producer = TransactionalProducer(cluster.bootstrap(), f"rebalance-{i}")
        try:
            producer.init_transactions()
            n = 0
            while not stop.is_set():
                values = [f"{i}-{n}-{k}" for k in range(3)]
                with producer.transaction():
                    for k, value in enumerate(values):
                        producer.send(topic, value, partition=(i + k) % PARTITIONS)
                committed[i].extend(values)
                n += 1
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            producer.close(timeout=10)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # load first, then the join
        cluster.start_coordinator(1)
        assert wait_balanced([first, second], timeout=30) == [25, 25]
        wait_until(lambda: _handoffs(first.url) >= 25, timeout=10, what="first to hand over")
        done_before_leave = sum(len(v) for v in committed.values())
        wait_until(lambda: sum(len(v) for v in committed.values()) > done_before_leave + 30,
                   timeout=30, what="commits after the join")  # fmt: skip
        first.stop()  # a clean stop: its leases are released, the second takes them all
        wait_until(lambda: owned_partitions(second) == 50, timeout=15, what="second holds all")
        done_after_leave = sum(len(v) for v in committed.values())
        wait_until(lambda: sum(len(v) for v in committed.values()) > done_after_leave + 30,
                   timeout=30, what="commits after the leave")  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors

    expected = sorted(v for values in committed.values() for v in values)
    seen: list[str] = []
    with Consumer(second.url, isolation_level="read_committed") as consumer:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + 60
        while len(seen) < len(expected) and time.monotonic() < deadline:
            seen += [str(r.value) for r in consumer.poll(timeout=0.5)]
        seen += [str(r.value) for r in consumer.poll(timeout=1.0)]  # nothing more may come
    assert len(seen) == len(set(seen)), "a record was written twice"
    assert sorted(seen) == expected
