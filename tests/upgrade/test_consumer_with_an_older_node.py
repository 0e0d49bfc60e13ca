"""A consumer of this release reads a cluster in the middle of a rolling upgrade: node 3 still
runs the previous release (the last one with replication), which has no ``POST /v1/fetch``
and answers it 404. The consumer reads that node's partitions one request each, as before,
and the other nodes' with one request per node; every record is read exactly once, and
the older node is asked the new way again once ``OLDER_NODE_RECHECK_S`` (shortened here to
2 s) has passed.
"""

from __future__ import annotations

import httpx
import pytest

from sdk import Consumer, TopicPartition
from sdk import _consumer_base as consumer_base
from tests.integration.test_fetch_many import Counting, Requests
from tests.support.cluster import ClusterFactory
from tests.support.processes import wait_until
from tests.support.releases import RELEASES, install
from tests.upgrade.test_rolling_upgrade import _run_with

pytestmark = pytest.mark.slow

TOPIC = "spread"
PARTITIONS = 9
RECORDS = 30


def test_the_older_node_is_read_per_partition(
    cluster_factory: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_base, "OLDER_NODE_RECHECK_S", 2.0)
    previous = install([r for r in RELEASES if r.replication][-1])
    cluster = cluster_factory(nodes=3, start=False)
    _run_with(cluster.node(3), previous.python)
    cluster.start()
    answer = httpx.post(f"{cluster.url}/v1/topics", timeout=120,
                        json={"name": TOPIC, "partitions": PARTITIONS})  # fmt: skip
    assert answer.status_code == 201, answer.text
    leaders = {p["partition"]: p["leader"]["url"].rstrip("/") for p in answer.json()["partitions"]}
    older = cluster.node(3).url.rstrip("/")
    assert older in leaders.values() and len(set(leaders.values())) == 3
    for p, url in leaders.items():
        sent = httpx.post(f"{url}/v1/partitions/{TOPIC}/{p}/records", timeout=30, json={
            "records": [{"value": f"p{p}-{i}"} for i in range(RECORDS)]})  # fmt: skip
        assert sent.status_code == 200, sent.text

    requests = Requests()
    got: list[str] = []
    with Consumer(cluster.url, max_poll_records=50, transport=Counting(requests)) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])

        def read_all() -> bool:
            got.extend(str(r.value) for r in consumer.poll(timeout=0.5))
            return len(got) >= PARTITIONS * RECORDS

        wait_until(read_all, timeout=60, what="every record")
        assert sorted(got) == sorted(f"p{p}-{i}" for p in range(PARTITIONS)
                                     for i in range(RECORDS))  # fmt: skip
        fetch_many, fetch_one = requests.of("fetch-many"), requests.of("fetch-one")
        newer = set(leaders.values()) - {older}
        assert fetch_many[older] >= 1 and fetch_one[older] >= PARTITIONS // 3
        assert all(fetch_many[url] >= 1 and fetch_one[url] == 0 for url in newer)
        # once the recheck interval has passed the older node is asked the new way again
        wait_until(lambda: consumer.poll(timeout=0.5) == []
                   and requests.of("fetch-many")[older] > fetch_many[older], timeout=30,
                   what="the older node asked again")  # fmt: skip
