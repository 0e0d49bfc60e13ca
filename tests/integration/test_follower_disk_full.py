"""A follower whose disk fills up under one partition of many falls behind on that one
only: it leaves that partition's ISR, by its leader's proposal, and stays in sync on every
other partition it copies from the same leader over the same batched fetch.

Real processes and a real fault: the follower is stopped, one partition's directory is
moved onto a tmpfs with a few kilobytes free (a mount of its own, so no other partition
shares the full disk), and the follower is started again. Records then go to every
partition; the follower's appends to that one fail with ENOSPC.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import Cluster, ClusterFactory
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow
TOPIC = "filling"
PARTITIONS = 6
#: The tmpfs under the full partition: its files at the start, and a few kilobytes more.
ROOM_BYTES = 8 * 1024
INTERNAL = {"authorization": f"Bearer {INTERNAL_TOKEN}"}


class SmallDisk:
    """A tmpfs mounted over one directory, holding that directory's files; undone (the
    files copied back) by ``undo``, which the fixture runs on every path."""

    def __init__(self) -> None:
        self.mounted: Path | None = None
        self._kept: Path | None = None

    def mount_over(self, directory: Path) -> None:
        kept = directory.with_name(directory.name + ".kept")
        shutil.copytree(directory, kept)
        used = sum(f.stat().st_size for f in kept.rglob("*") if f.is_file())
        size = ((used + ROOM_BYTES) // 4096 + 1) * 4096
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(directory)], capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            shutil.rmtree(kept)
            pytest.fail(f"this test mounts a tmpfs (needs root): {done.stderr.strip()}")
        self.mounted, self._kept = directory, kept
        shutil.copytree(kept, directory, dirs_exist_ok=True)

    def undo(self) -> None:
        if self.mounted is not None:
            subprocess.run(["umount", "-l", str(self.mounted)], check=False)
            self.mounted = None
        if self._kept is not None:
            shutil.rmtree(self._kept, ignore_errors=True)
            self._kept = None


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    disk = SmallDisk()
    try:
        yield disk
    finally:
        disk.undo()


def states(cluster: Cluster) -> list[dict[str, object]]:
    answer = httpx.get(f"{cluster.url}/v1/topics/{TOPIC}", timeout=30)
    answer.raise_for_status()
    partitions: list[dict[str, object]] = answer.json()["partitions"]
    return partitions


def test_a_full_disk_under_one_partition_costs_only_its_isr(
    cluster_factory: ClusterFactory, small_disk: SmallDisk
) -> None:
    cluster = cluster_factory(
        nodes=3, replication_factor=3, fsync=True,
        node_flags=("--replica-lag-time-max-ms", "1500",
                    "--controller-session-timeout-ms", "30000"),
        coordinator_flags=("--node-session-timeout-ms", "20000"),
    )  # fmt: skip
    created = httpx.post(f"{cluster.url}/v1/topics", timeout=60,
                         json={"name": TOPIC, "partitions": PARTITIONS})  # fmt: skip
    assert created.status_code == 201, created.text
    def settled() -> bool:
        """Every replica in sync and every partition led by its first replica (where the
        controller moves leadership back to after a restart)."""
        return all(sorted(p["isr"]) == [1, 2, 3]  # type: ignore[call-overload]
                   and p["leader"]["node_id"] == p["replicas"][0]  # type: ignore[index]
                   for p in states(cluster))  # fmt: skip

    wait_until(settled, timeout=60, what="every partition led by its first replica, in sync")
    full = 0
    preferred = [int(n) for n in states(cluster)[full]["replicas"]]  # type: ignore[attr-defined]
    leader, follower = preferred[0], preferred[1]
    node = cluster.node(follower)
    node.stop()
    assert node.data_dir is not None
    small_disk.mount_over(node.data_dir / f"{TOPIC}-{full}")
    cluster.start_node(follower)
    wait_until(settled, timeout=60, what="the follower back, every partition settled again")
    leaders = {int(p["partition"]): p["leader"] for p in states(cluster)}  # type: ignore[call-overload]
    assert leaders[full]["node_id"] == leader
    same_leader = [p for p, lead in leaders.items() if lead["node_id"] == leader and p != full]
    assert same_leader, leaders  # copied over the same fetch as the full one

    value = "v" * 1000
    for round_ in range(40):  # 40 KB to each partition: far past the room left
        for p, lead in leaders.items():
            answer = httpx.post(f"{lead['url']}/v1/partitions/{TOPIC}/{p}/records", timeout=60,
                                json={"acks": 1, "records": [{"value": f"{round_}{value}"}]})
            assert answer.status_code == 200, answer.text

    def dropped_from_the_full_one() -> bool:
        return follower not in states(cluster)[full]["isr"]  # type: ignore[operator]

    wait_until(dropped_from_the_full_one, timeout=60,
               what=f"node {follower} out of {TOPIC}-{full}'s ISR")  # fmt: skip
    # Every other partition, those copied from the same leader in the same fetch too, keeps
    # the follower in its ISR and its copy complete.
    ends = {p: httpx.get(f"{lead['url']}/v1/partitions/{TOPIC}/{p}/offsets").json()
            ["high_watermark"] for p, lead in leaders.items()}  # fmt: skip

    def caught_up_elsewhere() -> bool:
        listed = httpx.get(f"{node.url}/internal/v1/partitions", timeout=30,
                           headers=INTERNAL).json()["partitions"]  # fmt: skip
        mine = {e["partition"]: e["log_end_offset"] for e in listed if e["topic"] == TOPIC}
        return all(mine[p] >= ends[p] for p in leaders if p != full)

    wait_until(caught_up_elsewhere, timeout=60, what="the follower's other copies complete")
    isrs = {int(p["partition"]): p["isr"] for p in states(cluster)}  # type: ignore[call-overload]
    assert all(follower in isrs[p] for p in leaders if p != full), isrs
    node.stop()
