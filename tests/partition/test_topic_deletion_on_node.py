"""Topic deletion on real storage-node processes (``POST /internal/v1/topics/delete``,
``deleteTopicsOnNode``): the request the coordinators' deleter sends every node once a
topic has left the metadata.

Shown here: a deleted topic's partitions answer UNKNOWN_TOPIC_OR_PARTITION and their
directories leave the disk, while another topic is untouched; asking again answers 0; a
deletion survives a SIGKILL, and a deleted partition's directory left behind by a crash is
removed at start; a topic made again under the name starts empty (no offsets, no producer
state); a bad name and the offsets topic are refused entry by entry, a malformed request
whole; requests waiting on a partition when it goes (an acks=all produce, a long-poll
fetch) are answered at once; and on three replicating nodes, driven as the controller
would drive them, deleting on a follower and on the leader leaves every node serving and
the other topic replicating.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eos_cli.launcher import ClusterPlan, LocalCluster
from tests.support.envelope import envelope_problems
from tests.support.nodes import INTERNAL_TOKEN, NodeProcess
from tests.support.processes import wait_until

DELETE = "/internal/v1/topics/delete"
PARTITIONS = "/internal/v1/partitions"
INTERNAL = {"authorization": f"Bearer {INTERNAL_TOKEN}"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path_factory.mktemp("topic-deletion") / "data")
    process.start()
    yield process
    process.stop()


# -- helpers -------------------------------------------------------------------------------
def produce(url: str, topic: str, partition: int, values: list[str],
            **fields: Any) -> httpx.Response:  # fmt: skip
    return httpx.post(f"{url}/v1/partitions/{topic}/{partition}/records", timeout=40,
                      json={"records": [{"value": v} for v in values], **fields})  # fmt: skip


def fetch(url: str, topic: str, partition: int, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}/v1/partitions/{topic}/{partition}/records", timeout=40,
                     params={"offset": 0, **params})  # fmt: skip


def values(url: str, topic: str, partition: int) -> list[str]:
    answer = fetch(url, topic, partition)
    assert answer.status_code == 200, answer.text
    return [r["value"] for r in answer.json()["records"]]


def delete(url: str, *topics: str) -> list[dict[str, Any]]:
    answer = httpx.post(f"{url}{DELETE}", json={"topics": list(topics)}, headers=INTERNAL,
                        timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    return list(answer.json()["topics"])


def create(url: str, topic: str, partitions: range, replicas: list[int] | None = None) -> None:
    entries = [{"topic": topic, "partition": p, **({"replicas": replicas} if replicas else {})}
               for p in partitions]  # fmt: skip
    answer = httpx.post(f"{url}{PARTITIONS}", json={"partitions": entries}, headers=INTERNAL)
    assert answer.status_code == 200, answer.text
    assert all(e["error"] is None for e in answer.json()["partitions"]), answer.text


def listed(url: str) -> dict[tuple[str, int], dict[str, Any]]:
    rows = httpx.get(f"{url}{PARTITIONS}", headers=INTERNAL).json()["partitions"]
    return {(r["topic"], r["partition"]): r for r in rows}


def assert_unknown(answer: httpx.Response) -> None:
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION", answer.text
    assert envelope_problems(answer.status_code, answer.content) == []


def graves(data_dir: Path) -> list[str]:
    """Deleted partitions' directories not removed yet (``<topic>-<n>.deleted-<hex>``);
    not a partition of a topic whose name has ``.deleted-`` in it (``x.deleted-1-0``)."""
    return sorted(p.name for p in data_dir.iterdir()
                  if ".deleted-" in p.name and not p.name.rpartition("-")[2].isdigit())


def on_disk(data_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if p.name.rpartition("-")[0] == topic)


# -- one node ------------------------------------------------------------------------------
def test_a_deleted_topic_is_gone_and_another_is_untouched(node: NodeProcess) -> None:
    url, data = node.url, node.data_dir
    create(url, "gone", range(2))
    create(url, "stays", range(1))
    for topic, partition in (("gone", 0), ("gone", 1), ("stays", 0)):
        answer = produce(url, topic, partition, [f"{topic}-{partition}-{i}" for i in range(5)])
        assert answer.status_code == 200, answer.text
    assert on_disk(data, "gone") == ["gone-0", "gone-1"]

    assert delete(url, "gone") == [{"topic": "gone", "partitions_deleted": 2, "error": None}]

    for partition in (0, 1):
        assert_unknown(fetch(url, "gone", partition))
        assert_unknown(produce(url, "gone", partition, ["late"]))
    assert on_disk(data, "gone") == []
    wait_until(lambda: graves(data) == [], timeout=10, what="the graves to be removed")
    assert ("gone", 0) not in listed(url) and ("gone", 1) not in listed(url)
    # the other topic serves what it had, and takes more
    assert values(url, "stays", 0) == [f"stays-0-{i}" for i in range(5)]
    assert produce(url, "stays", 0, ["after"]).json()["base_offset"] == 5
    assert on_disk(data, "stays") == ["stays-0"]
    # idempotent: asked again (as the coordinator does), nothing is left to delete
    assert delete(url, "gone") == [{"topic": "gone", "partitions_deleted": 0, "error": None}]
    assert delete(url, "never-made") == [
        {"topic": "never-made", "partitions_deleted": 0, "error": None}
    ]


def test_a_topic_made_again_under_the_name_starts_empty(node: NodeProcess) -> None:
    url = node.url
    create(url, "again", range(1))
    idempotent = {"producer_id": 4242, "producer_epoch": 0}
    for sequence in range(3):
        answer = produce(url, "again", 0, [f"old-{sequence}"], base_sequence=sequence,
                         **idempotent)  # fmt: skip
        assert answer.status_code == 200 and not answer.json()["duplicate"], answer.text
    assert delete(url, "again")[0]["partitions_deleted"] == 1

    create(url, "again", range(1))
    offsets = httpx.get(f"{url}/v1/partitions/again/0/offsets").json()
    assert offsets == {"log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0}
    assert httpx.get(f"{url}/v1/partitions/again/0/producers").json() == {"producers": []}
    # the old producer's sequence 0 is no duplicate: its state went with the topic
    same = produce(url, "again", 0, ["new-0"], base_sequence=0, **idempotent)
    assert same.status_code == 200, same.text
    assert (same.json()["base_offset"], same.json()["duplicate"]) == (0, False)
    other = produce(url, "again", 0, ["new-1"], producer_id=4343, producer_epoch=0,
                    base_sequence=0)  # fmt: skip
    assert other.status_code == 200 and other.json()["base_offset"] == 1, other.text
    assert values(url, "again", 0) == ["new-0", "new-1"]


def test_bad_entries_are_refused_alone_and_bad_requests_whole(node: NodeProcess) -> None:
    url = node.url
    create(url, "__consumer_offsets", range(1))
    create(url, "legal", range(3))
    answers = delete(url, "bad name!", "__consumer_offsets", "legal", "..")
    assert [(a["topic"], a["partitions_deleted"]) for a in answers] == [
        ("bad name!", 0), ("__consumer_offsets", 0), ("legal", 3), ("..", 0)
    ]
    refused = {a["topic"]: a["error"] for a in answers if a["error"] is not None}
    assert set(refused) == {"bad name!", "__consumer_offsets", ".."}
    assert all(e["code"] == "INVALID_REQUEST" for e in refused.values())
    assert "an internal topic cannot be deleted" in refused["__consumer_offsets"]["message"]
    assert "bad name!" in refused["bad name!"]["message"]
    assert ("__consumer_offsets", 0) in listed(url)
    assert on_disk(node.data_dir, "legal") == []

    create(url, "legal", range(1))
    before = listed(url)
    malformed: list[Any] = [{"topics": []}, None, {"topics": "legal"}, {"topic": ["legal"]}]
    for body in malformed:
        answer = httpx.post(f"{url}{DELETE}", json=body, headers=INTERNAL)
        assert answer.status_code == 422, f"{body}: {answer.text}"
        assert answer.json()["error"]["code"] == "INVALID_REQUEST"
        assert envelope_problems(answer.status_code, answer.content) == []
    refused_whole = httpx.post(f"{url}{DELETE}", json={"topics": ["legal"]})  # no token
    assert refused_whole.status_code == 401, refused_whole.text
    assert refused_whole.json()["error"]["code"] == "UNAUTHENTICATED"
    assert listed(url) == before
    assert on_disk(node.data_dir, "legal") == ["legal-0"]


def test_requests_waiting_on_a_deleted_partition_are_answered(node: NodeProcess) -> None:
    """An acks=all produce waiting for a follower that never comes (node 2 does not
    exist) and a long-poll fetch waiting for records are answered
    UNKNOWN_TOPIC_OR_PARTITION at once, not at the end of their 30-second waits."""
    url = node.url
    create(url, "waiting", range(1), replicas=[1, 2])
    state = {"nodes": {"1": url}, "leader": 1, "leader_epoch": 1, "partition_epoch": 1,
             "replicas": [1, 2], "isr": [1, 2], "min_insync_replicas": 2}  # fmt: skip
    pushed = httpx.put(f"{url}/internal/v1/partitions/waiting/0/state", json=state,
                       headers=INTERNAL)  # fmt: skip
    assert pushed.status_code == 200 and pushed.json()["applied"], pushed.text
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        polling = pool.submit(fetch, url, "waiting", 0, max_wait_ms=30_000)
        producing = pool.submit(produce, url, "waiting", 0, ["stuck"])
        # appended here, not replicated: the produce waits for node 2
        wait_until(lambda: listed(url)[("waiting", 0)]["log_end_offset"] == 1, timeout=10,
                   what="the produce to be appended")  # fmt: skip
        assert not producing.done()
        assert delete(url, "waiting")[0]["partitions_deleted"] == 1
        assert_unknown(producing.result(timeout=10))
        assert_unknown(polling.result(timeout=10))
        assert time.monotonic() - started < 20
    assert on_disk(node.data_dir, "waiting") == []
    assert node.ready()


def test_a_deletion_survives_a_crash_and_graves_go_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    node = NodeProcess(data)
    node.start()
    try:
        create(node.url, "gone", range(2))
        create(node.url, "x.deleted-1", range(1))  # a topic's name may look like a grave
        for partition in (0, 1):
            assert produce(node.url, "gone", partition, ["v"]).status_code == 200
        assert produce(node.url, "x.deleted-1", 0, ["kept"]).status_code == 200
        assert delete(node.url, "gone")[0]["partitions_deleted"] == 2
        node.kill()  # at once: the answer said the deletion was durable
        planted = data / "old-3.deleted-5eb1a7c0ffee"  # as a crash mid-deletion leaves it
        (planted / "00000000000000000000.log").parent.mkdir()
        (planted / "00000000000000000000.log").write_bytes(b"\0" * 64)
        node.start()
        assert not planted.exists()
        assert graves(data) == []
        assert on_disk(data, "gone") == [] and on_disk(data, "old") == []
        now = listed(node.url)
        assert ("gone", 0) not in now and ("gone", 1) not in now and ("old", 3) not in now
        assert_unknown(fetch(node.url, "gone", 0))
        assert values(node.url, "x.deleted-1", 0) == ["kept"]
    finally:
        node.stop()


# -- three replicating nodes ---------------------------------------------------------------
@pytest.fixture
def replicating(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three nodes and no coordinator: the test is the controller, as in
    ``tests/integration/test_replication_nodes.py``."""
    plan = ClusterPlan(tmp_path / "cluster", nodes=3, coordinators=0, port_base=None,
                       token=INTERNAL_TOKEN, log_level="info")  # fmt: skip
    cluster = LocalCluster(plan).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def replicate(cluster: LocalCluster, topic: str) -> None:
    """``topic``-0 on all three nodes, led by node 1 in epoch 1, every replica in sync."""
    state = {"nodes": cluster.plan.node_urls, "leader": 1, "leader_epoch": 1,
             "partition_epoch": 1, "replicas": [1, 2, 3], "isr": [1, 2, 3],
             "min_insync_replicas": 2}  # fmt: skip
    for n in (1, 2, 3):
        create(cluster.node(n).url, topic, range(1), replicas=[1, 2, 3])
    for n in (1, 2, 3):
        answer = httpx.put(f"{cluster.node(n).url}/internal/v1/partitions/{topic}/0/state",
                           json=state, headers=INTERNAL)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["applied"], answer.text


def log_end(cluster: LocalCluster, n: int, topic: str) -> int | None:
    row = listed(cluster.node(n).url).get((topic, 0))
    return None if row is None else int(row["log_end_offset"])


@pytest.mark.slow
def test_deleting_on_a_follower_and_the_leader_leaves_replication_running(
    replicating: LocalCluster,
) -> None:
    cluster = replicating
    leader = cluster.node(1).url
    replicate(cluster, "doomed")
    replicate(cluster, "kept")
    for topic in ("doomed", "kept"):  # acks=all, ISR of three: on every node when answered
        answer = produce(leader, topic, 0, [f"{topic}-{i}" for i in range(10)])
        assert answer.status_code == 200, answer.text
    assert all(log_end(cluster, n, "doomed") == 10 for n in (1, 2, 3))

    # a follower first (its session to the leader is polling both), then the leader (node
    # 3 still follows the topic from it: its fetches answer that entry with an error)
    assert delete(cluster.node(2).url, "doomed")[0]["partitions_deleted"] == 1
    assert produce(leader, "kept", 0, ["k-1"]).status_code == 200
    assert delete(leader, "doomed")[0]["partitions_deleted"] == 1
    assert_unknown(produce(leader, "doomed", 0, ["late"]))
    for round_ in range(3):
        answer = produce(leader, "kept", 0, [f"k-2-{round_}"])  # needs both followers
        assert answer.status_code == 200, answer.text
    assert delete(cluster.node(3).url, "doomed")[0]["partitions_deleted"] == 1

    for n in (1, 2, 3):
        assert cluster.node(n).ready(), f"node {n} is not ready"
        assert log_end(cluster, n, "doomed") is None
        data_dir = cluster.node(n).data_dir
        assert data_dir is not None and on_disk(data_dir, "doomed") == []
    wait_until(lambda: all(log_end(cluster, n, "kept") == 14 for n in (2, 3)), timeout=10,
               what="the followers to copy the other topic")  # fmt: skip

    # made again under the name, it replicates from offset 0 (no old epoch in the way)
    replicate(cluster, "doomed")
    answer = produce(leader, "doomed", 0, ["reborn"])
    assert answer.status_code == 200 and answer.json()["base_offset"] == 0, answer.text
    assert all(log_end(cluster, n, "doomed") == 1 for n in (1, 2, 3))
