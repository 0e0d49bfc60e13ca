"""Retention end to end, on real processes and PostgreSQL: a topic's retention set at
creation and changed by an alter reaches the nodes; whole segments go; the log start
advances and survives a restart; a fetch below it is OFFSET_OUT_OF_RANGE and a consumer
with auto_offset_reset=earliest jumps to it; with three replicas the followers delete too;
bad alters change nothing."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from eos_protocol.acl import AclBinding, Operation, Permission, ResourceType
from sdk import AdminClient, Consumer, Producer
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

SEGMENT_BYTES = 4096
NODE_FLAGS = ("--segment-bytes", str(SEGMENT_BYTES), "--retention-check-interval-ms", "200")


def segment_bases(data_dir: Path, topic: str, partition: int = 0) -> list[int]:
    return sorted(int(p.stem) for p in (data_dir / f"{topic}-{partition}").glob("*.log"))


def offsets(cluster: Cluster, topic: str) -> dict[str, int]:
    with AdminClient(cluster.bootstrap()) as admin:
        return admin.list_offsets((topic, 0)).model_dump()


def fill(cluster: Cluster, topic: str, count: int) -> None:
    with Producer(cluster.bootstrap(), batch_size=1024, linger_ms=0) as producer:
        for i in range(count):
            producer.send(topic, f"{i:05d}-" + "x" * 200, partition=0)
        producer.flush()


def test_retention_advances_the_log_start_and_readers_follow(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(nodes=1, database="postgres", node_flags=NODE_FLAGS)
    # an idempotent producer that writes once, then again after its batches are deleted
    early = Producer(cluster.bootstrap(), linger_ms=0)
    with AdminClient(cluster.bootstrap()) as admin:
        info = admin.create_topic("kept", retention_ms=-1, retention_bytes=-1)
        assert (info.retention_ms, info.retention_bytes) == (-1, -1)
        assert early.send("kept", "early", partition=0).result(timeout=30).offset == 0
        fill(cluster, "kept", 120)
        node_dir = cluster.node(1).data_dir
        assert node_dir is not None
        assert len(segment_bases(node_dir, "kept")) > 3
        assert offsets(cluster, "kept")["log_start_offset"] == 0  # unlimited: nothing goes

        altered = admin.alter_topic("kept", retention_ms=1000)
        assert (altered.retention_ms, altered.retention_bytes) == (1000, -1)
        assert admin.describe_topic("kept").retention_ms == 1000
    # once every closed segment is older than a second, all of them go, never the active one
    wait_until(lambda: len(segment_bases(node_dir, "kept")) == 1, timeout=30,
               what="every closed segment to be deleted")  # fmt: skip
    start = offsets(cluster, "kept")["log_start_offset"]
    assert segment_bases(node_dir, "kept") == [start] and start > 0
    # its state outlived its batches: the next one is taken, not UNKNOWN_PRODUCER_ID
    with early:
        assert early.send("kept", "late", partition=0).result(timeout=30).offset > start

    below = httpx.get(f"{cluster.node(1).url}/v1/partitions/kept/0/records",
                      params={"offset": 0})  # fmt: skip
    assert below.status_code == 416
    assert below.json()["error"]["code"] == "OFFSET_OUT_OF_RANGE"

    with Consumer(cluster.bootstrap(), auto_offset_reset="earliest") as consumer:
        consumer.assign([("kept", 0)])
        consumer.seek(("kept", 0), 0)
        records = consumer.poll(timeout=10)
    assert records and records[0].offset == start
    assert [r.offset for r in records] == list(range(start, start + len(records)))

    cluster.node(1).stop()
    cluster.start_node(1)
    assert offsets(cluster, "kept")["log_start_offset"] == start


def test_bad_alters_change_nothing(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(nodes=1, database="postgres")
    with AdminClient(cluster.bootstrap()) as admin:
        admin.create_topic("steady", retention_ms=5000, retention_bytes=1 << 20)
    with cluster.client(None) as client:
        for body in ({"retention_ms": -5}, {"retention_bytes": "lots"}, {},
                     {"retention_ms": 10, "compaction": True}):  # fmt: skip
            answer = client.patch("/v1/topics/steady", json=body)
            assert answer.status_code in (400, 422), (body, answer.text)
            assert answer.json()["error"]["code"] == "INVALID_REQUEST"
        missing = client.patch("/v1/topics/nowhere", json={"retention_ms": 10})
        assert missing.json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
        offsets_topic = client.patch("/v1/topics/__consumer_offsets", json={"retention_ms": 10})
        assert offsets_topic.json()["error"]["code"] == "INVALID_REQUEST"
        created = client.post("/v1/topics", json={"name": "bad", "partitions": 1,
                                                  "retention_ms": -2})  # fmt: skip
        assert created.json()["error"]["code"] == "INVALID_REQUEST"
        topic = client.get("/v1/topics/steady").json()
        assert (topic["retention_ms"], topic["retention_bytes"]) == (5000, 1 << 20)
        assert client.get("/v1/topics/bad").status_code == 404


def test_followers_delete_below_their_leaders_log_start(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(nodes=3, database="postgres", node_flags=NODE_FLAGS)
    with AdminClient(cluster.bootstrap()) as admin:
        info = admin.create_topic("shared", replication_factor=3, retention_bytes=3 * SEGMENT_BYTES)
    assert len(info.partitions[0].replicas) == 3
    fill(cluster, "shared", 150)
    dirs = [cluster.node(n).data_dir for n in (1, 2, 3)]

    def log_bytes(d: Path) -> int:
        total = 0
        for segment in (d / "shared-0").glob("*.log"):
            with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
                total += segment.stat().st_size
        return total

    def every_replica_deleted() -> bool:
        """Each replica's log starts above 0 and is back near the size limit (the limit,
        plus the segment that would take it below, plus the active one)."""
        present = [d for d in dirs if d is not None]
        bases = [segment_bases(d, "shared") for d in present]
        return len(bases) == 3 and all(b and b[0] > 0 for b in bases) and all(
            log_bytes(d) < 6 * SEGMENT_BYTES for d in present
        )

    wait_until(every_replica_deleted, timeout=30, what="every replica to delete segments")
    assert offsets(cluster, "shared")["log_start_offset"] > 0


def eos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eos_cli.main", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_alter_needs_alter_on_the_topic_and_the_cli_sets_retention(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(nodes=1, auth=True)
    admin_token, writer_token = cluster.tokens["admin"], cluster.tokens["writer"]
    b = ("--bootstrap", cluster.bootstrap())
    created = eos("--token", admin_token, "topics", "create", "guarded", "--retention-ms",
                  "60000", "--retention-bytes", "1048576", *b)  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "records kept 60000 ms, at most 1048576 bytes" in created.stdout
    refused = eos("--token", writer_token, "topics", "alter", "guarded", "--retention-ms", "5", *b)
    assert refused.returncode == 1 and "TOPIC_AUTHORIZATION_FAILED" in refused.stderr
    empty = eos("--token", admin_token, "topics", "alter", "guarded", *b)
    assert empty.returncode == 1 and "nothing to change" in empty.stderr
    with AdminClient(cluster.bootstrap(), token=admin_token) as admin:
        admin.create_acls([AclBinding(principal="User:writer", resource_type=ResourceType.TOPIC,
                                      resource_name="guarded", operation=Operation.ALTER,
                                      permission=Permission.ALLOW)])  # fmt: skip

    def writer_alters() -> bool:
        done = eos("--token", writer_token, "topics", "alter", "guarded", "--retention-ms",
                   "-1", *b)  # fmt: skip
        return done.returncode == 0 and "records kept for ever" in done.stdout

    wait_until(writer_alters, timeout=30, what="the writer's alter to be allowed")
    with AdminClient(cluster.bootstrap(), token=admin_token) as admin:
        info = admin.describe_topic("guarded")
    assert (info.retention_ms, info.retention_bytes) == (-1, 1048576)


def test_a_follower_away_past_the_retention_starts_again_at_the_leaders_log_start(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(nodes=2, database="postgres", node_flags=NODE_FLAGS)
    with AdminClient(cluster.bootstrap()) as admin:
        info = admin.create_topic("away", replication_factor=2, min_insync_replicas=1,
                                  retention_bytes=2 * SEGMENT_BYTES)  # fmt: skip
    leader = info.partitions[0].leader.node_id
    follower = 3 - leader
    fill(cluster, "away", 10)
    follower_dir = cluster.node(follower).data_dir
    assert follower_dir is not None
    wait_until(lambda: bool(segment_bases(follower_dir, "away")), what="the follower's copy")
    cluster.node(follower).stop()
    fill(cluster, "away", 150)  # the leader alone, far past the follower's log end
    wait_until(lambda: offsets(cluster, "away")["log_start_offset"] > 10, timeout=30,
               what="the leader's log start to pass the follower's log end")  # fmt: skip
    cluster.start_node(follower)
    start = offsets(cluster, "away")["log_start_offset"]

    def caught_up() -> bool:
        bases = segment_bases(follower_dir, "away")
        return bool(bases) and bases[0] >= start and (follower_dir / "away-0" /
                                                      "log-start-offset").exists()

    wait_until(caught_up, timeout=30, what="the follower to start again at the log start")
    with AdminClient(cluster.bootstrap()) as admin:
        wait_until(lambda: not admin.describe_topic("away").partitions[0].under_replicated,
                   timeout=30, what="the follower back in the ISR")  # fmt: skip
