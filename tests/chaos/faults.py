"""The faults of the chaos runs, one class each: the cluster it needs, the database it runs
on, what one injection does, and what must have happened for the run to count.

An injection waits for its conditions by polling (a node back up, a lease taken over, a
transaction timed out), never by sleeping for a while and hoping. Each fault counts what it
did, so a run whose faults silently did nothing fails instead of passing.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from eos_cli.launcher import ChildProcess
from tests.chaos.cluster import PrivatePostgres, chaos_spec
from tests.chaos.copier import EXIT_FENCED
from tests.chaos.history import History, OutputValue, TxnKey, load_copiers, read_events
from tests.chaos.workload import CopierSlot, Workload, describe_txn, wait_for
from tests.support.coordinators import temp_database
from tests.support.processes import wait_until
from tests.support.proxy import NO_FAULTS, FaultPlan


class Fault:
    """The base: a shared throw-away database, no injection."""

    name = "none"
    spec = chaos_spec()
    txn_timeout_ms = 15_000
    #: Records/s per copier at most, for a fault whose injections take longer than the
    #: mode's pace leaves the copy to run (None: the mode's pace).
    pace: int | None = None

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.rng = random.Random(self.name)

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        with temp_database() as url:
            yield url

    def starts_at(self, k: int, injections: int) -> float:
        """The share of the input copied when injection ``k`` is made: evenly spaced, so
        that each lands while the copiers are at work."""
        return (k + 1) / (injections + 2)

    def inject(self, workload: Workload, k: int) -> None:
        raise NotImplementedError

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        """What did not happen as it should have (empty: the faults did their job), and
        what no fault excuses: an INTERNAL_ERROR answered to a copier (a service must
        answer a retriable error, never a 500, for a fault it can ride out)."""
        done = self.counts["injected"]
        found = [] if done == injections else [f"{done} of {injections} injections happened"]
        found += [
            f"copier {c.copier}.{c.instance} was answered {e['message']!r}"
            for c in history.copiers
            for e in c.events
            if e["e"] == "error" and "INTERNAL_ERROR" in str(e.get("message", ""))
        ]
        return found


def _live_slot(workload: Workload, k: int) -> CopierSlot:
    """A copier still at work, the k-th in turn when several are."""
    with workload.lock:
        live = [s for s in workload.slots.values() if not s.done and s.process is not None]
    assert live, "every copier has finished: the fault came too late"
    return live[k % len(live)]


class NodeKill(Fault):
    """SIGKILL a storage node (fsync on, as in production) and start it again."""

    name = "node SIGKILL + restart"
    spec = chaos_spec(nodes=2, fsync=True)

    def inject(self, workload: Workload, k: int) -> None:
        node_id = 1 + k % len(workload.cluster.nodes)
        workload.cluster.restart_node(node_id)
        self.counts["injected"] += 1


class CoordinatorKill(Fault):
    """Two coordinators on one database with short leases; SIGKILL one, wait until the
    other has taken over the copiers' transactional ids, then start the dead one again."""

    name = "coordinator SIGKILL + failover"
    spec = chaos_spec(coordinators=2, lease_ms=2000)

    def inject(self, workload: Workload, k: int) -> None:
        cluster = workload.cluster
        tids = [workload.tid(p) for p in workload.slots]
        # The victim is the instance owning most of the copiers' ids (each in turn on a
        # tie): the instance restarted by the previous injection may not have taken its
        # share back yet, and killing one that owns none would prove no takeover.
        owners = [_owner(cluster.coordinators[k % 2].url, t) for t in tids]
        held = [owners.count(c.url) for c in cluster.coordinators]
        index = k % 2 if held[k % 2] >= held[(k + 1) % 2] else (k + 1) % 2
        victim = cluster.coordinators[index]
        survivor = cluster.coordinators[(index + 1) % 2]
        moved = [t for t, owner in zip(tids, owners, strict=True) if owner == victim.url]
        victim.kill()
        wait_for(
            "the survivor to own every transactional id",
            lambda: all(_owner(survivor.url, t) == survivor.url for t in tids),
            timeout=cluster.spec.lease_ms / 1000 + 20,
        )
        self.counts["takeovers"] += len(moved)
        cluster.restart_coordinator(index)
        self.counts["injected"] += 1

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        found = super().problems(workload, injections, history)
        if self.counts["takeovers"] == 0:
            found.append("no transactional id ever moved to the surviving coordinator")
        return found


def commit_times(directory: Path) -> list[float]:
    """When every copier commit was acknowledged, in order (from the copiers' histories)."""
    return sorted(
        float(event["t"])
        for copier in load_copiers(directory)
        for event in copier.events
        if event["e"] == "commit_ok"
    )


class CoordinatorFailover(Fault):
    """The coordinator every storage node and client was configured with — the owner of
    half the leases — is SIGKILLed and stays down until commits have resumed
    without it, so nothing can wait for it to come back. Nodes and clients must find the
    survivor on their own (it is in no configuration: they learn it from the cluster).

    Even injections kill coordinator 0, the configured one; odd ones kill whichever
    instance owns the copiers' transactional ids then. ``windows`` holds, per injection,
    the time from the kill to the first commit acknowledged after it."""

    name = "configured coordinator SIGKILL, no restart until commits resume"
    spec = chaos_spec(coordinators=2, lease_ms=2000, entry=0, coordinator_timeout_ms=1000)
    #: A stall longer than this is a defect, not noise (the target is lease + 1 s).
    LIMIT_S = 10.0
    #: Each injection waits for the nodes to learn the restarted instance and restarts
    #: it: at the mode's pace the copiers could finish before the last kill, leaving no
    #: commit to wait for.
    pace = 60

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[float] = []

    def _victim(self, workload: Workload, k: int) -> int:
        if k % 2 == 0:
            return 0
        cluster = workload.cluster
        owners = {_owner(c.url, workload.tid(0)) for c in cluster.coordinators}
        for index, c in enumerate(cluster.coordinators):
            if c.url in owners:
                return index
        return 0

    def stop_victim(self, workload: Workload, index: int) -> None:
        workload.cluster.coordinators[index].kill()

    def revive_victim(self, workload: Workload, index: int) -> None:
        workload.cluster.restart_coordinator(index)

    def inject(self, workload: Workload, k: int) -> None:
        index = self._victim(workload, k)
        cluster = workload.cluster
        # Configured with one instance, a node can only fall over to instances it has
        # learned: wait until each has (a restarted victim comes back as a new instance).
        wait_for(
            "every node to know every coordinator",
            lambda: all(
                _known_coordinators(node.url) >= len(cluster.coordinators)
                for node in cluster.nodes
            ),
            timeout=30,
        )
        killed_at = time.monotonic()
        self.stop_victim(workload, index)
        after: list[float] = []

        def resumed() -> bool:
            after[:] = [t for t in commit_times(workload.dir) if t > killed_at]
            return bool(after)

        wait_for("a commit without the stopped coordinator", resumed, timeout=60)
        self.windows.append(after[0] - killed_at)
        self.counts["longest stop-to-commit ms"] = int(max(self.windows) * 1000)
        self.counts[f"coordinator {index} stopped"] += 1
        self.revive_victim(workload, index)
        self.counts["injected"] += 1

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        found = super().problems(workload, injections, history)
        slow = [round(w, 2) for w in self.windows if w > self.LIMIT_S]
        if slow:
            found.append(f"commits stalled for {slow} s after a coordinator stopped")
        return found


class CoordinatorPause(CoordinatorFailover):
    """As ``CoordinatorFailover``, with SIGSTOP: the paused process keeps its sockets
    open and answers nothing, so only timeouts reveal it. SIGCONT after commits resumed:
    the woken instance's leases have moved on and its writes are fenced."""

    name = "configured coordinator SIGSTOP, SIGCONT after commits resume"

    def stop_victim(self, workload: Workload, index: int) -> None:
        workload.cluster.coordinators[index].pause()

    def revive_victim(self, workload: Workload, index: int) -> None:
        workload.cluster.coordinators[index].resume()


def _known_coordinators(node_url: str) -> float:
    text = httpx.get(f"{node_url}/metrics", timeout=5.0).text
    for line in text.splitlines():
        if line.startswith("eos_node_known_coordinators "):
            return float(line.split()[1])
    return 0.0


def _epoch(url: str, tid: str) -> int:
    """The producer epoch the coordinator holds for ``tid`` (-1 if it cannot say now)."""
    return int(str((describe_txn(url, tid) or {}).get("producer_epoch", -1)))


def _owner(url: str, tid: str) -> str | None:
    answer = httpx.get(f"{url}/v1/coordinators", params={"key": tid}, timeout=5.0)
    return str(answer.json()["url"]).rstrip("/") if answer.status_code == 200 else None


class PostgresRestart(Fault):
    """The coordinator's own PostgreSQL (a private instance: the shared one serves other
    tests) stopped and started again; every other time with ``-m immediate``."""

    name = "PostgreSQL restart"

    def __init__(self) -> None:
        super().__init__()
        self.pg: PrivatePostgres | None = None

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        with PrivatePostgres.running() as pg:
            self.pg = pg
            yield pg.create_database(f"eos_chaos_{uuid.uuid4().hex[:8]}")

    def inject(self, workload: Workload, k: int) -> None:
        assert self.pg is not None
        self.pg.restart(immediate=k % 2 == 0)
        self.counts["injected"] += 1


@dataclass(frozen=True)
class Zombie:
    """One paused copier: the transaction it was stopped in and when, whether a
    replacement took its transactional id before it went on, and its history."""

    paused_in: TxnKey
    paused_at: float
    replaced: bool
    exit_code: int | None  # None: it went on copying
    history: Path

    def commits_after_pause(self) -> int:
        events = read_events(self.history)
        return sum(1 for e in events if e["e"] == "commit_ok" and e["t"] > self.paused_at)


class CopierPause(Fault):
    """SIGSTOP a copier inside a transaction until the coordinator has timed that
    transaction out (its epoch bumped), on odd injections also start a replacement with
    the same transactional id, then SIGCONT.

    A zombie that met a replacement must be fenced and commit nothing more. One that did
    not is only a slow producer: it may abort at its old epoch and go on at the bumped one
    (docs/design.md, "Retries"; KIP-588's recovery from a timeout), or be fenced; either
    way the transaction it was paused in stays aborted."""

    name = "copier SIGSTOP past timeout (zombie)"
    txn_timeout_ms = 3000

    def __init__(self) -> None:
        super().__init__()
        self._paused = 0.0  # when the current zombie was stopped
        self.zombies: list[Zombie] = []

    def inject(self, workload: Workload, k: int) -> None:
        slot = _live_slot(workload, k)
        p = slot.partition
        with workload.lock:
            slot.held = True
            zombie, instance = slot.process, slot.instance
        assert zombie is not None
        url, tid = workload.cluster.coordinator_url(0), workload.tid(p)
        replaced = k % 2 == 1
        try:
            epoch = self._pause_in_transaction(workload, zombie, p, instance)
            wait_for(
                "the coordinator to time the paused transaction out",
                lambda: _epoch(url, tid) > epoch,
                timeout=self.txn_timeout_ms / 1000 + 20,
            )
            if replaced:
                replacement = workload.start_copier(p)
                wait_until(
                    lambda: workload.last_event(p, replacement) not in (None, "start"),
                    timeout=60,
                    what="the replacement to start copying",
                )
                self.counts["replaced"] += 1
        finally:
            zombie.send_signal(signal.SIGCONT)
        path = workload.history_path(p, instance)
        paused_at = self._paused
        paused_in = [e["txn"] for e in read_events(path) if e["e"] == "begin"
                     and e["t"] < paused_at][-1]  # fmt: skip
        if replaced:
            code: int | None = zombie.wait(timeout=90)
        else:  # fenced, or aborted at its old epoch and going on (the class docstring)
            wait_until(
                lambda: zombie.poll() is not None or _went_on(path, paused_at, paused_in),
                timeout=90, what="the zombie to be fenced or to abort its transaction",
            )  # fmt: skip
            code = zombie.poll()
        self.zombies.append(Zombie(TxnKey(p, instance, paused_in), paused_at, replaced, code, path))
        self.counts["fenced" if code == EXIT_FENCED else "went on"] += 1
        with workload.lock:
            if code is not None:
                slot.exits[instance] = code
            # an exited zombie without a replacement is started again by the supervisor;
            # one that went on is supervised as any copier
            slot.held = False
        self.counts["injected"] += 1

    def _pause_in_transaction(
        self, workload: Workload, zombie: ChildProcess, p: int, instance: int
    ) -> int:
        """SIGSTOP the copier at a moment it has a transaction open at the coordinator;
        returns the producer epoch it holds."""
        path = workload.history_path(p, instance)
        wait_until(
            lambda: any(e["e"] == "init" for e in read_events(path)),
            timeout=60,
            what="the copier to get its producer id",
        )
        first = next(e["producer_epoch"] for e in read_events(path) if e["e"] == "init")
        url, tid = workload.cluster.coordinator_url(0), workload.tid(p)
        for _ in range(200):
            wait_until(
                lambda: workload.last_event(p, instance) == "begin" or zombie.poll() is not None,
                timeout=60, interval=0.005, what="the copier to begin a transaction",
            )  # fmt: skip
            assert zombie.poll() is None, f"copier {p} finished before it could be paused"
            os.kill(zombie.pid, signal.SIGSTOP)
            self._paused = time.monotonic()
            view = describe_txn(url, tid) or {}
            # Transaction version 2 bumps the epoch at every commit: the epoch held now is
            # the coordinator's, at or above the one init gave.
            epoch = view.get("producer_epoch")
            if (
                workload.last_event(p, instance) == "begin"
                and view.get("state") == "Ongoing"
                and isinstance(epoch, int)
                and epoch >= first
            ):
                return epoch
            os.kill(zombie.pid, signal.SIGCONT)  # between calls: try the next transaction
        raise AssertionError("could not pause the copier inside a transaction")

    def problems(self, workload: Workload, injections: int, history: History) -> list[str]:
        found = super().problems(workload, injections, history)
        if injections > 1 and not self.counts["replaced"]:
            found.append("no zombie met a replacement")
        visible = {
            OutputValue.decode(raw).key for records in history.output.values()
            for _, raw in records
        }  # fmt: skip
        for zombie in self.zombies:
            stopped = zombie.paused_in
            if zombie.replaced and zombie.exit_code != EXIT_FENCED:
                found.append(f"the zombie paused in {stopped} met a replacement and was not "
                             f"fenced (exit {zombie.exit_code})")  # fmt: skip
            commits = zombie.commits_after_pause()
            if zombie.replaced and commits:
                found.append(f"the zombie paused in {stopped} committed {commits} "
                             "transactions beside its replacement")  # fmt: skip
            for key in visible:
                later = zombie.replaced and key.txn > stopped.txn
                if key[:2] == stopped[:2] and (key.txn == stopped.txn or later):
                    found.append(f"a record of zombie transaction {key} is visible")
        return found


def _went_on(history: Path, paused_at: float, txn: int) -> bool:
    """Whether a copier ended the transaction it was paused in and is still running."""
    return any(
        e["e"] in ("abort_ok", "commit_ok") and e.get("txn") == txn and e["t"] > paused_at
        for e in read_events(history)
    )


class CopierKill(Fault):
    """SIGKILL a copier at a chosen moment (inside a transaction, while its commit request
    is out, while its abort is out) and let the supervisor start it again with the same
    transactional id."""

    name = "copier SIGKILL + restart"
    MOMENTS = ("begin", "commit_start", "abort_start")

    def inject(self, workload: Workload, k: int) -> None:
        slot = _live_slot(workload, k)
        p = slot.partition
        with workload.lock:
            slot.held = True
            process, instance = slot.process, slot.instance
        assert process is not None
        moment = self.MOMENTS[k % len(self.MOMENTS)]
        try:
            wait_until(
                lambda: workload.last_event(p, instance) == moment or process.poll() is not None,
                timeout=60, interval=0.002, what=f"copier {p} to reach {moment}",
            )  # fmt: skip
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            self.counts[f"killed at {moment}"] += 1
        finally:
            with workload.lock:
                slot.held = False
        self.counts["injected"] += 1


class ProxyFaults(Fault):
    """Answers between a coordinator and a node slowed and dropped after the request was
    applied, in both directions (markers and partition calls one way, transaction
    verification the other); every other window also client traffic to that node.

    A window stays open until answers were dropped both ways, and the coordinator-node
    traffic is only a call or two per transaction each way (fewer on a busy machine, where
    markers queue up and go out in batches). So the windows open early in the copy, one
    after the other, each while plenty of transactions are still to come, and drop half
    the answers, so that each closes soon."""

    name = "coordinator<->node slow/dropped answers"
    # The proxied node asks only through the proxy: learning the coordinators behind it
    # would let it route around the faults this case is about.
    spec = chaos_spec(proxied_node=1, node_flags=("--no-learn-coordinators",))
    WANT = 2  # answers dropped on the node's side per window (and one on the other side)

    def starts_at(self, k: int, injections: int) -> float:
        return 0.05 + 0.2 * k / injections  # 5%, 12%, 18% of the copy in the short mode

    def inject(self, workload: Workload, k: int) -> None:
        cluster = workload.cluster
        node, coordinator = cluster.node_proxy, cluster.coordinator_proxy
        assert node is not None and coordinator is not None
        proxies = [node, coordinator]
        paths = ("/internal/",) if k % 2 == 0 else ("/internal/", "/v1/")
        # Half the answers dropped: a window closes within a few calls each way, so the last
        # one still opens with most of the copy to come (at 0.35, a run slowed by a loaded
        # machine once ended with the third window one drop short).
        plan = FaultPlan(paths=paths, delay_rate=0.3, delay_s=0.4, drop_rate=0.5)
        before = [proxy.counts["dropped"] for proxy in proxies]
        for proxy in proxies:
            proxy.set_plan(plan)

        def dropped() -> tuple[int, int]:
            return (node.counts["dropped"] - before[0], coordinator.counts["dropped"] - before[1])

        try:
            wait_until(
                lambda: (dropped()[0] >= self.WANT and dropped()[1] >= 1) or workload.all_done(),
                timeout=90, interval=0.05, what="answers dropped both ways",
            )  # fmt: skip
        finally:
            for proxy in proxies:
                proxy.set_plan(NO_FAULTS)
        assert dropped()[0] >= self.WANT and dropped()[1] >= 1, (
            f"window {k}: dropped {dropped()} (node side, coordinator side) before the copy "
            f"ended; counts {[dict(p.counts) for p in proxies]}"
        )
        for name, proxy in zip(("node", "coordinator"), proxies, strict=True):
            self.counts[f"dropped at {name}"] = proxy.counts["dropped"]
            self.counts[f"delayed at {name}"] = proxy.counts["delayed"]
        self.counts["injected"] += 1


FAULTS: list[type[Fault]] = [
    NodeKill,
    CoordinatorKill,
    CoordinatorFailover,
    CoordinatorPause,
    PostgresRestart,
    CopierPause,
    CopierKill,
    ProxyFaults,
]


def run_dir(root: Path, fault: Fault) -> Path:
    return root / type(fault).__name__.lower()
