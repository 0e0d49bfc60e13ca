"""The faults of replicated partitions: three nodes, every topic with three replicas and
a minimum of two in sync, and the copy workload's transactions running through them.

* ``LeaderKill``: SIGKILL a node while it leads partitions; in-sync followers take over
  (new leader epochs) and the node, restarted, catches up and rejoins every ISR;
* ``NodeWipe``: SIGKILL a node, let its partitions fail over, delete its whole data
  directory and start it empty: it copies every partition again, those it led included,
  from the new leaders;
* ``LeaderIsolation``: cut a node off from its followers and from the controller (its
  followers' fetches and its heartbeats never arrive; it still takes client requests). It
  must stop acknowledging acks=all writes — its high watermark does not move while it is
  cut off — the controller elects other leaders, and once the cut is healed the node
  follows them, cutting off what it wrote alone.

Each waits for the cluster to be whole again (every partition led, every ISR full) before
the next injection, and counts what happened, so a fault that did nothing fails its case.
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any

import httpx

from sdk import AdminClient, Producer, RecordMetadata
from tests.chaos.cluster import chaos_spec
from tests.chaos.faults import Fault, commit_times
from tests.chaos.history import History
from tests.chaos.workload import Workload, wait_for
from tests.support.proxy import NO_FAULTS, FaultPlan

# Leaders move back to their preferred replicas every second, so that a node that came
# back leads again before the next injection.
REPLICATED = {
    "nodes": 3, "fsync": True, "replication_factor": 3,
    "coordinator_flags": (*chaos_spec().coordinator_flags,
                          "--leader-rebalance-interval-ms", "1000"),
}  # fmt: skip
INTERNAL_PREFIX = "/internal/v1/"


def partition_states(workload: Workload) -> list[dict[str, Any]]:
    """Every partition of both topics as the controller has it (with its topic)."""
    states: list[dict[str, Any]] = []
    with httpx.Client(timeout=5) as client:
        for topic in (workload.input, workload.output):
            answer = client.get(f"{workload.cluster.bootstrap().split(',')[0]}/v1/topics/{topic}")
            answer.raise_for_status()
            states += [{**p, "topic": topic} for p in answer.json()["partitions"]]
    return states


def whole(workload: Workload) -> bool:
    """Every partition led by a live node, with every replica in sync."""
    return all(
        s["leader"]["node_id"] != -1 and sorted(s["isr"]) == sorted(s["replicas"])
        for s in partition_states(workload)
    )


def led_by(workload: Workload, node_id: int) -> list[tuple[str, int]]:
    """(topic, partition) of the partitions ``node_id`` leads."""
    return [(s["topic"], s["partition"]) for s in partition_states(workload)
            if s["leader"]["node_id"] == node_id]  # fmt: skip


def busiest_leader(workload: Workload, k: int) -> int:
    """The node leading most partitions (ties broken by ``k``, so injections rotate)."""
    counts = {n: len(led_by(workload, n)) for n in range(1, 4)}
    best = max(counts.values())
    leaders = [n for n, c in counts.items() if c == best]
    return leaders[k % len(leaders)]


def failed_over(workload: Workload, node_id: int) -> bool:
    states = partition_states(workload)
    return all(s["leader"]["node_id"] not in (node_id, -1) for s in states)


class ReplicatedFault(Fault):
    """The base of the replicated faults: the cluster whole again after each injection."""

    spec = chaos_spec(**REPLICATED)

    def heal(self, workload: Workload) -> None:
        started = time.monotonic()
        wait_for("every partition led and every ISR full again", lambda: whole(workload),
                 timeout=60)  # fmt: skip
        self.counts["healed in ms (last)"] = int((time.monotonic() - started) * 1000)

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        found = super().problems(workload, injections, history)
        if self.counts["elections"] < injections:
            found.append(f"only {self.counts['elections']} elections in {injections} faults")
        return found


class LeaderKill(ReplicatedFault):
    name = "leader SIGKILL (RF=3), restart"

    def inject(self, workload: Workload, k: int) -> None:
        victim = busiest_leader(workload, k)
        before = led_by(workload, victim)
        workload.cluster.node(victim).kill()
        started = time.monotonic()
        wait_for(f"an in-sync follower to lead every partition of node {victim}",
                 lambda: failed_over(workload, victim), timeout=30)  # fmt: skip
        self.counts["failover ms (last)"] = int((time.monotonic() - started) * 1000)
        self.counts["elections"] += len(before)
        workload.cluster.start_node(victim)
        self.heal(workload)
        self.counts["injected"] += 1


class NodeWipe(ReplicatedFault):
    name = "node SIGKILL, data directory deleted, restart empty (RF=3)"

    def inject(self, workload: Workload, k: int) -> None:
        victim = busiest_leader(workload, k)
        node = workload.cluster.node(victim)
        before = led_by(workload, victim)
        node.kill()
        wait_for(f"every partition of node {victim} to fail over",
                 lambda: failed_over(workload, victim), timeout=30)  # fmt: skip
        assert node.data_dir is not None
        shutil.rmtree(node.data_dir)
        workload.cluster.start_node(victim)
        self.heal(workload)  # it copied every partition again, those it led included
        self.counts["elections"] += len(before)
        self.counts["partitions copied again"] += len(partition_states(workload))
        self.counts["injected"] += 1


class LeaderIsolation(ReplicatedFault):
    """Node 1 is reached only through proxies: followers' fetches and the controller's
    pushes through the node's, its heartbeats and ISR changes through the coordinator's.
    Both cut those requests (never forwarded) for the length of a window."""

    name = "leader cut off from followers and controller (RF=3)"
    spec = chaos_spec(**REPLICATED, proxied_node=1, node_flags=("--no-learn-coordinators",))

    def inject(self, workload: Workload, k: int) -> None:
        cluster = workload.cluster
        node, coordinator = cluster.node_proxy, cluster.coordinator_proxy
        assert node is not None and coordinator is not None
        wait_for("node 1 to lead an output partition",
                 lambda: self._writes_led(workload), timeout=30)  # fmt: skip
        led = self._writes_led(workload)
        # every path of each kind: one partition at a time and batched (a batched ISR
        # change left uncut once shrank the ISR to node 1 alone before the election)
        followers_and_pushes = (f"{INTERNAL_PREFIX}replicas/", f"{INTERNAL_PREFIX}partitions/",
                                f"{INTERNAL_PREFIX}partition-states")  # fmt: skip
        beats_and_isr = (f"{INTERNAL_PREFIX}nodes/", f"{INTERNAL_PREFIX}partitions/",
                         f"{INTERNAL_PREFIX}isr-changes")  # fmt: skip
        node.set_plan(FaultPlan(paths=followers_and_pushes, cut_rate=1.0))
        coordinator.set_plan(FaultPlan(paths=beats_and_isr, cut_rate=1.0))
        try:
            wait_for("other leaders for node 1's partitions",
                     lambda: failed_over(workload, 1), timeout=30)  # fmt: skip
            # From here on (fetches in flight at the cut are long answered) no follower
            # reaches it: whatever it takes, it must not acknowledge.
            frozen = self._high_watermarks(workload, led)
            wait_for("node 1 to stop leading", lambda: not self._leads_any(workload),
                     timeout=30)  # fmt: skip
            after = self._high_watermarks(workload, led)
            assert after == frozen, f"node 1 acknowledged writes while cut off: {frozen} -> {after}"
            self.counts["elections"] += len(led)
            self.counts["cut requests"] = node.counts["cut"] + coordinator.counts["cut"]
        finally:
            node.set_plan(NO_FAULTS)
            coordinator.set_plan(NO_FAULTS)
        self.heal(workload)
        self.counts["injected"] += 1

    def _writes_led(self, workload: Workload) -> list[int]:
        """The output partitions (those the copiers write) node 1 leads."""
        return [p for t, p in led_by(workload, 1) if t == workload.output]

    def _direct(self, workload: Workload) -> str:
        return workload.cluster.node(1).url  # the node itself, not its proxy

    def _high_watermarks(self, workload: Workload, partitions: list[int]) -> dict[int, int]:
        """Node 1's high watermark of each output partition, read from the node itself."""
        listed = httpx.get(f"{self._direct(workload)}/internal/v1/partitions",
                           headers=_internal(workload), timeout=5).json()  # fmt: skip
        return {p["partition"]: p["high_watermark"] for p in listed["partitions"]
                if p["topic"] == workload.output and p["partition"] in partitions}  # fmt: skip

    def _leads_any(self, workload: Workload) -> bool:
        text = httpx.get(f"{self._direct(workload)}/metrics", timeout=5).text
        return any(line.startswith("eos_node_partition_leader{") and line.endswith(" 1.0")
                   and "__consumer_offsets" not in line for line in text.splitlines())  # fmt: skip


class AckedWriter:
    """An idempotent ``Producer`` (acks=all) sending unique values to one partition from a
    thread of its own, keeping each value whose send was acknowledged: what must never be
    lost, whatever happens to the replicas afterwards. ``hold`` stops the sending until
    ``release`` (what was sent is answered meanwhile)."""

    def __init__(self, bootstrap: str, topic: str, partition: int, tag: str) -> None:
        self.topic, self.partition, self.tag = topic, partition, tag
        self.sent: list[tuple[str, Future[RecordMetadata]]] = []
        self._producer = Producer(bootstrap, linger_ms=5)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a send and a hold never interleave
        self._sending = True
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"acked {tag}")
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0.02):  # about 50 records a second
            with self._lock:
                if not self._sending:
                    continue
                value = f"{self.tag}.{i}"
                future = self._producer.send(self.topic, value, partition=self.partition)
                self.sent.append((value, future))
                i += 1

    def hold(self) -> None:
        """No send after this returns, and every one made before is answered."""
        with self._lock:
            self._sending = False
        self._producer.flush()

    def release(self) -> None:
        with self._lock:
            self._sending = True

    def stop(self) -> list[str]:
        """Stop sending, wait for every answer; the values acknowledged."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._producer.close()
        return [v for v, f in self.sent if f.done() and f.exception() is None]


class FollowersPausedLeaderKilled(ReplicatedFault):
    """Both followers of a leader are SIGSTOPped while it takes writes; once the controller
    has the ISR down to the leader alone and the leader holds writes no follower has, the
    leader is SIGKILLed and the followers are resumed.

    The writes are the copiers' transactions and an idempotent producer (``AckedWriter``)
    on a side topic partition the victim leads. The side topic allows unclean elections:
    a resumed follower leads it, so whatever the old leader alone held is gone — and with
    min.insync.replicas 2 acks=all acknowledged none of it (issue 27), so no acknowledged
    side value may be missing. For that to be the fault's only way to lose a value, both
    followers hold exactly the leader's log when they stop (the writer is held while they
    catch up): an unclean election may otherwise pick the follower that was a few records
    behind while the other one and the leader acknowledged them, a loss unclean elections
    allow by design. The copiers' topics elect cleanly: their partitions wait for the old
    leader, which restarts with all it had. ``windows``: per injection, the longest stretch
    without a commit from the pause until the cluster is whole again."""

    name = "followers SIGSTOPped under load, leader SIGKILLed, followers resumed (RF=3)"
    spec = chaos_spec(**REPLICATED, node_flags=("--replica-lag-time-max-ms", "2000"))

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[float] = []
        self.side = f"chaos-acked-{uuid.uuid4().hex[:8]}"
        self.lost: list[str] = []

    def inject(self, workload: Workload, k: int) -> None:
        cluster = workload.cluster
        if k == 0:
            with AdminClient(cluster.bootstrap()) as admin:
                admin.create_topic(self.side, 3, unclean_leader_election=True)
        wait_for("every side partition led and fully in sync",
                 lambda: all(s["leader"]["node_id"] != -1 and len(s["isr"]) == 3
                             for s in self._side_states(workload)), timeout=60)  # fmt: skip
        side = k % 3  # the side partition whose leader is the victim: it takes writes
        victim = int(self._side_states(workload)[side]["leader"]["node_id"])
        writer = AckedWriter(cluster.bootstrap(), self.side, side, f"k{k}")
        try:
            wait_for("the side writer's first acknowledgement",
                     lambda: any(f.done() for _, f in writer.sent), timeout=30)  # fmt: skip
            paused_at = time.monotonic()
            self._pause_followers_kill_leader(workload, victim, side, writer)
            cluster.start_node(victim)
            self.heal(workload)
        finally:
            acked = writer.stop()
        self.windows.append(_longest_gap(commit_times(workload.dir), paused_at, time.monotonic()))
        self.counts["longest window without a commit ms"] = int(max(self.windows) * 1000)
        self.lost += self._missing(workload, side, acked)
        self.counts["side records acknowledged"] += len(acked)
        self.counts["injected"] += 1

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        found = super().problems(workload, injections, history)
        if self.counts["side records acknowledged"] == 0:
            found.append("the side writer had no record acknowledged")
        if self.lost:
            found.append(f"{len(self.lost)} acknowledged side records lost: {self.lost[:10]}")
        return found

    def _pause_followers_kill_leader(
        self, workload: Workload, victim: int, side: int, writer: AckedWriter
    ) -> None:
        cluster = workload.cluster
        tp = (self.side, side)
        followers = [n for n in (1, 2, 3) if n != victim]
        writer.hold()
        wait_for(f"both followers of {tp} holding node {victim}'s whole log",
                 lambda: len({self._log_end(workload, n, tp) for n in (1, 2, 3)}) == 1,
                 timeout=60)  # fmt: skip
        end = self._log_end(workload, victim, tp)
        for n in followers:
            cluster.node(n).pause()
        writer.release()
        try:
            wait_for(f"{tp} in sync on node {victim} alone",
                     lambda: self._side_states(workload)[side]["isr"] == [victim],
                     timeout=60)  # fmt: skip
            wait_for(f"node {victim} to take writes its stopped followers lack",
                     lambda: self._log_end(workload, victim, tp) > end, timeout=60)  # fmt: skip
            cluster.node(victim).kill()
        finally:
            for n in followers:
                cluster.node(n).resume()
        wait_for(f"a resumed follower to lead {tp} (an unclean election)",
                 lambda: self._side_states(workload)[side]["leader"]["node_id"]
                 not in (victim, -1), timeout=60)  # fmt: skip
        self.counts["elections"] += 1

    def _missing(self, workload: Workload, side: int, acked: list[str]) -> list[str]:
        """The acknowledged values not in the side partition. Read again until all are
        there or a deadline passes: a leader that took over after the heal may answer
        with a high watermark (so a last stable offset) a little behind its
        predecessor's until its followers fetch again."""
        missing = acked
        deadline = time.monotonic() + 60
        while missing and time.monotonic() < deadline:
            present = {v for _, v in workload.read_all(self.side, side)}
            missing = [v for v in acked if v not in present]
        return missing

    def _side_states(self, workload: Workload) -> list[dict[str, Any]]:
        """The side topic's partitions as the controller has them, by index."""
        url = workload.cluster.bootstrap().split(",")[0]
        answer = httpx.get(f"{url}/v1/topics/{self.side}", timeout=5)
        answer.raise_for_status()
        return sorted(answer.json()["partitions"], key=lambda p: p["partition"])

    def _log_end(self, workload: Workload, node_id: int, tp: tuple[str, int]) -> int:
        """The log end of ``tp`` on ``node_id``, read from the node itself."""
        listed = httpx.get(f"{workload.cluster.node(node_id).url}/internal/v1/partitions",
                           headers=_internal(workload), timeout=5).json()  # fmt: skip
        (end,) = [p["log_end_offset"] for p in listed["partitions"]
                  if (p["topic"], p["partition"]) == tp]  # fmt: skip
        return int(end)


def _longest_gap(commits: list[float], start: float, end: float) -> float:
    """The longest time in [start, end] with no commit acknowledged."""
    inside = [start, *(t for t in commits if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def _internal(workload: Workload) -> dict[str, str]:
    return {"authorization": f"Bearer {workload.cluster.plan.internal_token()}"}


REPLICA_FAULTS: list[type[Fault]] = [
    LeaderKill, NodeWipe, LeaderIsolation, FollowersPausedLeaderKilled,
]
