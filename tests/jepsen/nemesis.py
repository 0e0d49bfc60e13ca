"""The nemesis: faults scheduled from a seed, each injected, held, healed and recorded.

Every fault kind of a Jepsen analysis of a Kafka-like system, on real hosts (network
namespaces, ``hosts.py``):

* ``partition-host``: one server host cut from every other host, clients included.
* ``leader-cut``: a partition leader cut from every coordinator (its controller), while
  clients and the other storage nodes still reach it: it keeps taking writes it cannot
  know it no longer leads.
* ``asymmetric``: one direction only: what a storage node or coordinator sends to the other
  servers is lost, what they send to it arrives.
* ``majority-minority``: one coordinator and one node cut from the rest (PostgreSQL on the
  majority side); clients reach both sides.
* ``bridge``: two halves that meet only through one node.
* ``pg-cut``: PostgreSQL cut from one coordinator (which still reaches everything else).
* ``kill`` / ``pause``: SIGKILL or SIGSTOP of a coordinator, a storage node (often a
  leader) or PostgreSQL; the heal restarts or resumes it.
* ``leader-crash``: a leader cut from its followers, then killed two seconds later, while
  they are still in its ISR (they leave it only after ``replica_lag_time_max_ms``): one of
  them is elected without what the leader took meanwhile, which it must not have
  acknowledged.
* ``clock-skew``: a coordinator restarted with its wall clock minutes ahead or behind; the
  heal restarts it on the true time.
* ``combined``: two of the above at once.

Each fault is a pair of steps (inject, heal) chosen up front from the seed, so a run is
repeatable but for the timing of the processes themselves; the leader a fault aims at is
looked up when it is injected. Every fault heals before the next, and ``heal_all`` undoes
whatever is left (the run's last step before its final reads).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tests.jepsen.history import DATA_TOPIC, Fault, Recorder

KINDS = (
    "partition-host",
    "leader-cut",
    "asymmetric",
    "majority-minority",
    "bridge",
    "pg-cut",
    "kill",
    "pause",
    "leader-crash",
    "clock-skew",
    "combined",
)
#: How long a crashing leader is cut from its followers before it is killed.
CRASH_AFTER_S = 2.0
#: Faults a combination is made of (a clock skew restarts a coordinator: not combined).
_COMBINABLE = ("partition-host", "leader-cut", "asymmetric", "pg-cut", "kill", "pause")
#: How far a skewed coordinator's clock is off, seconds (either way).
SKEW_S = 300.0


def schedule(seed: int, count: int) -> list[str]:
    """``count`` fault kinds: every kind once in a seeded order, then seeded picks."""
    rng = random.Random(f"schedule-{seed}")
    kinds = list(KINDS)
    rng.shuffle(kinds)
    while len(kinds) < count:
        kinds.append(rng.choice(KINDS))
    return kinds[:count]


class Hosts(Protocol):
    """What the nemesis needs of the cluster (``hosts.HostCluster``)."""

    coordinator_names: list[str]
    node_names: list[str]
    client_names: list[str]

    def drop(self, src: str, dst: str) -> None: ...
    def cut(self, a: str, b: str) -> None: ...
    def heal_network(self) -> None: ...
    def kill(self, name: str) -> None: ...
    def pause(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def restart(self, name: str, clock_offset_s: float = 0.0) -> None: ...
    def leader_of(self, topic: str, partition: int) -> int | None: ...


@dataclass
class Step:
    """One fault: what it did (for the record) and how to undo it."""

    kind: str
    detail: str
    heal: Callable[[], None]


@dataclass
class Nemesis:
    hosts: Hosts
    seed: int
    recorder: Recorder
    clock: Callable[[], float]
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def run(
        self, kinds: list[str], hold_s: float, quiet_s: float, stopping: Callable[[], bool]
    ) -> None:
        """Each fault in turn: inject, hold ``hold_s``, heal, then ``quiet_s`` of calm."""
        for kind in kinds:
            if stopping():
                return
            started = self.clock()
            steps = self.inject(kind)
            time.sleep(hold_s)
            for step in reversed(steps):
                step.heal()
            detail = "; ".join(f"{s.kind}: {s.detail}" for s in steps)
            self.recorder.record(Fault(kind, started, self.clock(), detail))
            time.sleep(quiet_s)

    # --- injecting ----------------------------------------------------------------------

    def inject(self, kind: str) -> list[Step]:
        if kind == "combined":
            first, second = self.rng.sample(_COMBINABLE, 2)
            return [self.inject(first)[0], self.inject(second)[0]]
        return [getattr(self, "_" + kind.replace("-", "_"))()]

    def _servers(self) -> list[str]:
        return [*self.hosts.coordinator_names, *self.hosts.node_names]

    def _leader(self) -> str:
        """The host leading a random data partition (any node when none is known)."""
        leader = self.hosts.leader_of(DATA_TOPIC, self.rng.randrange(4))
        if leader is None:
            return self.rng.choice(self.hosts.node_names)
        return f"n{leader}"

    def _cut_groups(self, side_a: list[str], side_b: list[str]) -> Callable[[], None]:
        for a in side_a:
            for b in side_b:
                self.hosts.cut(a, b)
        return self.hosts.heal_network

    def _partition_host(self) -> Step:
        host = self.rng.choice(self._servers())
        others = [h for h in [*self._servers(), "pg", *self.hosts.client_names] if h != host]
        return Step("partition-host", host, self._cut_groups([host], others))

    def _leader_cut(self) -> Step:
        leader = self._leader()
        heal = self._cut_groups([leader], self.hosts.coordinator_names)
        return Step("leader-cut", f"{leader} from the coordinators", heal)

    def _asymmetric(self) -> Step:
        host = self._leader() if self.rng.random() < 0.6 else self.rng.choice(self._servers())
        others = [h for h in [*self._servers(), "pg"] if h != host]
        for other in others:
            self.hosts.drop(host, other)
        return Step("asymmetric", f"{host} -> servers dropped", self.hosts.heal_network)

    def _majority_minority(self) -> Step:
        minority = [self.rng.choice(self.hosts.coordinator_names), self._leader()]
        majority = [h for h in [*self._servers(), "pg"] if h not in minority]
        heal = self._cut_groups(minority, majority)
        return Step("majority-minority", f"{minority} | {majority}", heal)

    def _bridge(self) -> Step:
        nodes = list(self.hosts.node_names)
        self.rng.shuffle(nodes)
        bridge, rest = nodes[0], nodes[1:]
        coordinators = list(self.hosts.coordinator_names)
        self.rng.shuffle(coordinators)
        half = len(coordinators) // 2 or 1
        left = [*coordinators[:half], *rest[: len(rest) // 2]]
        right = [h for h in [*self._servers(), "pg"] if h not in left and h != bridge]
        heal = self._cut_groups(left, right)
        return Step("bridge", f"{left} | {bridge} | {right}", heal)

    def _pg_cut(self) -> Step:
        coordinator = self.rng.choice(self.hosts.coordinator_names)
        return Step("pg-cut", coordinator, self._cut_groups(["pg"], [coordinator]))

    def _target(self) -> str:
        """A process to kill or pause: a leader half the time, else any server or
        PostgreSQL."""
        if self.rng.random() < 0.5:
            return self._leader()
        return self.rng.choice([*self._servers(), "pg"])

    def _kill(self) -> Step:
        target = self._target()
        self.hosts.kill(target)
        return Step("kill", target, lambda: self.hosts.restart(target))

    def _pause(self) -> Step:
        target = self._target()
        self.hosts.pause(target)
        return Step("pause", target, lambda: self.hosts.resume(target))

    def _leader_crash(self) -> Step:
        leader = self._leader()
        followers = [n for n in self.hosts.node_names if n != leader]
        for follower in followers:
            self.hosts.cut(leader, follower)
        time.sleep(CRASH_AFTER_S)
        self.hosts.kill(leader)

        def heal() -> None:
            self.hosts.heal_network()
            self.hosts.restart(leader)

        return Step("leader-crash", f"{leader} cut from {followers}, then killed", heal)

    def _clock_skew(self) -> Step:
        coordinator = self.rng.choice(self.hosts.coordinator_names)
        offset = SKEW_S if self.rng.random() < 0.5 else -SKEW_S
        self.hosts.restart(coordinator, clock_offset_s=offset)
        return Step(
            "clock-skew", f"{coordinator} {offset:+.0f} s", lambda: self.hosts.restart(coordinator)
        )
