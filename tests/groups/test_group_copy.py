"""Three copies of a transactional consume-transform-produce application in one consumer
group, over a topic of 12 partitions, while copies are added, SIGKILLed, paused past their
session (SIGSTOP, then SIGCONT) and stopped (tests/groups/group_copier.py).

Checked at the end: the output is the input exactly once, in order, partition by
partition; the group was balanced after every change; no partition was owned by two
copies at once, judged from the copies' own logs; every commit of a copy fell inside its
ownership of the partitions it committed; and the resumed zombie's offsets were refused
(and its output with them, by the first check).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Consumer, Producer, TopicPartition
from tests.support.children import Children
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 12
SESSION_MS = 4_000
FLAGS = ("--group-session-timeout-ms", str(SESSION_MS), "--group-heartbeat-interval-ms", "500")


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Iterator[Cluster]:
    yield module_cluster_factory(coordinator_flags=FLAGS)


class Copies:
    """The copies of one run: started, stopped and their logs read back."""

    def __init__(self, cluster: Cluster, children: Children, root: Path, group: str,
                 topics: tuple[str, str]) -> None:
        self.cluster, self.children, self.root = cluster, children, root
        self.group, self.topics = group, topics
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: name -> wall time its process was killed or stopped for good
        self.ended: dict[str, float] = {}

    def log(self, name: str) -> Path:
        return self.root / f"{name}.jsonl"

    def pause_file(self, name: str) -> Path:
        return self.root / f"{name}.pause"

    def start(self, name: str) -> None:
        argv = [sys.executable, "-m", "tests.groups.group_copier", "--url", self.cluster.url,
                "--group", self.group, "--input", self.topics[0], "--output", self.topics[1],
                "--tid", f"{self.group}-{name}", "--log", str(self.log(name)),
                "--pause-file", str(self.pause_file(name))]
        self.procs[name] = self.children.start(argv, log=self.root / f"{name}.out")

    def events(self, name: str) -> list[dict[str, Any]]:
        path = self.log(name)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def member_id(self, name: str) -> str | None:
        ids = [e["member_id"] for e in self.events(name) if e["event"] == "member"]
        return ids[-1] if ids else None


def describe(cluster: Cluster, group: str) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.url}/v1/groups/{group}", params={"lag": "false"}, timeout=30)
    return dict(answer.json()) if answer.status_code == 200 else {}


def wait_balanced(cluster: Cluster, copies: Copies, names: list[str]) -> None:
    """Until the group has exactly these copies as members, stable, 12 partitions shared
    to within one."""
    def balanced() -> bool:
        group = describe(cluster, copies.group)
        members = {m["member_id"]: m for m in group.get("members", [])}
        wanted = {copies.member_id(n) for n in names}
        if None in wanted or set(members) != wanted or group.get("state") != "stable":
            return False
        sizes = [len(m["assignment"]) for m in members.values()]
        return sum(sizes) == PARTITIONS and max(sizes) - min(sizes) <= 1

    wait_until(balanced, timeout=90, what=f"group balanced over {names}")


def owned_now(copies: Copies, name: str) -> set[int]:
    """The partitions a copy holds by its own log (assigned, not since revoked or lost)."""
    owned: set[int] = set()
    for e in copies.events(name):
        if e["event"] == "assigned":
            owned |= set(e["partitions"])
        elif e["event"] in ("revoked", "lost"):
            owned -= set(e["partitions"])
    return owned


def ownership_problems(copies: Copies) -> list[str]:
    """Overlapping ownership, and commits outside ownership, from the copies' logs."""
    intervals: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    problems: list[str] = []
    for name in copies.procs:
        owned: dict[int, float] = {}
        spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        end_of_life = copies.ended.get(name, float("inf"))
        for e in copies.events(name):
            if e["event"] == "assigned":
                for p in e["partitions"]:
                    owned[p] = e["t"]
            elif e["event"] in ("revoked", "lost"):
                for p in e["partitions"]:
                    if p in owned:
                        spans[p].append((owned.pop(p), e["t"]))
            elif e["event"] in ("pausing", "stopped"):
                for p, since in owned.items():  # a paused copy owns nothing it can use
                    spans[p].append((since, e["t"]))
                owned = {}
            elif e["event"] == "commit":
                for p in map(int, e["offsets"]):
                    inside = p in owned or any(a <= e["t"] <= b for a, b in spans[p])
                    if not inside:
                        problems.append(f"{name} committed partition {p} it did not own")
        for p, since in owned.items():
            spans[p].append((since, end_of_life))
        for p, items in spans.items():
            intervals[p] += [(a, b, name) for a, b in items]
    for p, items in intervals.items():
        items.sort()
        for (_a1, b1, n1), (a2, _b2, n2) in itertools.pairwise(items):
            if a2 < b1 and n1 != n2:
                problems.append(f"partition {p} owned by {n1} and {n2} at once ({a2:.3f})")
    return problems


def test_three_copies_copy_exactly_once_through_kills_pauses_and_moves(
    cluster: Cluster, children: Children, tmp_path: Path,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source, sink, group = f"in-{suffix}", f"out-{suffix}", f"copy-{suffix}"
    with httpx.Client(base_url=cluster.url, timeout=60) as c:
        for name in (source, sink):
            created = c.post("/v1/topics", json={"name": name, "partitions": PARTITIONS})
            assert created.status_code == 201, created.text
    feeding = threading.Event()
    sent: dict[int, list[str]] = defaultdict(list)

    def feed() -> None:
        with Producer(cluster.url) as producer:
            i = 0
            while not feeding.is_set() or i < 600:
                for p in range(PARTITIONS):
                    value = f"{p}:{i}"
                    producer.send(source, value, key=f"k{p}", partition=p)
                    sent[p].append(value)
                producer.flush()
                i += 1
                feeding.wait(0.02)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    copies = Copies(cluster, children, tmp_path, group, (source, sink))
    try:
        copies.start("a")
        copies.start("b")
        wait_balanced(cluster, copies, ["a", "b"])
        copies.start("c")
        wait_balanced(cluster, copies, ["a", "b", "c"])
        copies.ended["b"] = time.time()
        children.kill(copies.procs["b"])
        wait_balanced(cluster, copies, ["a", "c"])
        copies.start("d")
        wait_balanced(cluster, copies, ["a", "c", "d"])
        copies.pause_file("a").touch()  # a zombie: stops itself inside a transaction
        wait_until(lambda: any(e["event"] == "pausing" for e in copies.events("a")),
                   timeout=60, what="copy a paused inside a transaction")
        wait_balanced(cluster, copies, ["c", "d"])  # a's session ran out
        # The group's description runs ahead of the database by a write; a partition
        # reaches its new owner only once its removal from a is durable, after which a's
        # offsets are refused (before it, a commit of a's is decided first and the new
        # owner goes on after it: exactly once either way, but nothing refused to see).
        zombie = next(set(e["partitions"]) for e in reversed(copies.events("a"))
                      if e["event"] == "pausing")
        wait_until(lambda: zombie <= owned_now(copies, "c") | owned_now(copies, "d"),
                   timeout=60, what=f"a's partitions {sorted(zombie)} at c and d")
        os.kill(copies.procs["a"].pid, signal.SIGCONT)
        wait_until(lambda: any(e["event"] == "refused" for e in copies.events("a")),
                   timeout=60, what="the resumed zombie's offsets refused")
        wait_balanced(cluster, copies, ["a", "c", "d"])  # it joined again
        children.stop(copies.procs["c"])  # a graceful leave
        wait_balanced(cluster, copies, ["a", "d"])
    finally:
        feeding.set()
        feeder.join(timeout=120)
    ends = {p: len(values) for p, values in sent.items()}

    def all_copied() -> bool:
        with Consumer(cluster.url, group_id=group) as consumer:
            done = consumer.committed([(source, p) for p in range(PARTITIONS)],
                                      require_stable=False)
        return all((done.get(TopicPartition(source, p)) or _Zero).offset >= ends[p]
                   for p in range(PARTITIONS))

    wait_until(all_copied, timeout=120, what="every input record copied")
    for name in ("a", "d"):
        children.stop(copies.procs[name])
    got: dict[int, list[str]] = defaultdict(list)
    with Consumer(cluster.url) as reader:
        reader.assign([(sink, p) for p in range(PARTITIONS)])

        def read_all() -> bool:
            """Everything sent has been read (a killed copy's open transaction holds the
            last stable offset until its timeout aborts it)."""
            for r in reader.poll(timeout=1.0):
                got[r.partition].append(str(r.value))
            return all(len(got[p]) >= len(sent[p]) for p in range(PARTITIONS))

        wait_until(read_all, timeout=120, what="the whole output read_committed")
        for _ in range(3):  # and anything past it: a duplicate would be there
            for r in reader.poll(timeout=1.0):
                got[r.partition].append(str(r.value))
    for p in range(PARTITIONS):
        assert got[p] == sent[p], f"partition {p}: output is not the input exactly once"
    refusals = [e for e in copies.events("a") if e["event"] == "refused"]
    assert refusals and refusals[0]["code"] in ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID")
    assert ownership_problems(copies) == []


class _Zero:
    offset = 0


def test_the_ownership_check_catches_two_owners(tmp_path: Path) -> None:
    """The checker itself: two copies that both believe they own partition 3 at once."""
    copies = Copies.__new__(Copies)
    copies.root, copies.ended = tmp_path, {}
    copies.procs = {"x": None, "y": None}  # type: ignore[dict-item]
    for name, t0 in (("x", 1.0), ("y", 2.0)):
        copies.log(name).write_text(
            json.dumps({"t": t0, "event": "assigned", "partitions": [3]}) + "\n"
            + json.dumps({"t": t0 + 5, "event": "revoked", "partitions": [3]}) + "\n"
        )
    assert any("owned by x and y" in p for p in ownership_problems(copies))
