"""One Jepsen-style run from start to verdict, and the command that runs one by hand.

    scripts/jepsen.sh --minutes 10 --seed 7          # python -m tests.jepsen.run ...

A run: start the namespaced cluster (``hosts.py``), make the two topics (replication
factor 3), start the workloads on the client hosts (two producers, two copiers in one
group, two readers), let the nemesis inject its seeded faults one after the other, heal
everything, wait until every service answers again, stop the workloads, read everything
(``workload final``), check the history and write the report. Everything of a run lives
under one folder: the histories (``*.jsonl``), the services' logs, ``summary.md``,
``anomalies.json`` and ``timeline.svg``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.jepsen.checker import Report, check
from tests.jepsen.history import COPY_TOPIC, DATA_TOPIC, Event, Recorder, Txn, read_history
from tests.jepsen.history import Outcome as TxnOutcome
from tests.jepsen.hosts import HostCluster, HostSpec
from tests.jepsen.nemesis import KINDS, Nemesis, schedule
from tests.jepsen.report import write_report
from tests.jepsen.workload import PARTITIONS

#: The processes of the workload: (name, role, client host).
WORKERS = (
    ("p1", "producer", "cl1"),
    ("p2", "producer", "cl2"),
    ("c1", "copier", "cl2"),
    ("c2", "copier", "cl3"),
    ("r1", "reader", "cl3"),
    ("r2", "reader", "cl1"),
)


@dataclass(frozen=True)
class RunPlan:
    seed: int
    faults: list[str]  # the kinds, in order (``Nemesis.schedule``)
    hold_s: float = 8.0  # how long each fault lasts
    quiet_s: float = 6.0  # calm after each heal
    warmup_s: float = 8.0  # workload alone before the first fault
    spec: HostSpec = field(default_factory=HostSpec)
    final_wait_s: float = 120.0  # for every transaction to be decided before the final read
    #: the workload's pace: each producer's and copier's pause after a transaction, a
    #: reader's after a poll that found records. Long runs press hard; the suite's run
    #: paces itself, because it shares two cores with the rest of the suite.
    pause_s: float = 0.05

    @property
    def minutes(self) -> float:
        return (self.warmup_s + len(self.faults) * (self.hold_s + self.quiet_s)) / 60


@dataclass
class Outcome:
    folder: Path
    events: list[Event]
    report: Report
    summary: Path


def plan_for(seed: int, minutes: float, spec: HostSpec | None = None) -> RunPlan:
    """As many faults as fit in ``minutes`` (at least every kind once)."""
    base = RunPlan(seed, [], spec=spec or HostSpec())
    each = base.hold_s + base.quiet_s
    count = max(len(KINDS), int((minutes * 60 - base.warmup_s) // each))
    return RunPlan(seed, schedule(seed, count), spec=base.spec)


def _create_topics(cluster: HostCluster) -> None:
    """Both topics, replicated on every node, retried while the cluster settles."""
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=30) as client:
        for name in (DATA_TOPIC, COPY_TOPIC):
            while True:
                body = {"name": name, "partitions": PARTITIONS,
                        "replication_factor": min(3, cluster.spec.nodes)}  # fmt: skip
                try:
                    answer = client.post(cluster.coordinator_urls[0] + "/v1/topics", json=body)
                except httpx.HTTPError:
                    answer = None
                if answer is not None and answer.status_code in (200, 201, 409):
                    break
                if time.monotonic() > deadline:
                    detail = answer.text if answer is not None else "no answer"
                    raise RuntimeError(f"topic {name} not created: {detail}")
                time.sleep(1)


def _workload_argv(cluster: HostCluster, name: str, role: str, folder: Path, t0: float,
                   plan: RunPlan) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "tests.jepsen.workload", role, "--name", name,
            "--bootstrap", cluster.bootstrap, "--folder", str(folder), "--t0", f"{t0:.6f}",
            "--seed", str(plan.seed), "--pause-s", str(plan.pause_s)]  # fmt: skip


def run(folder: Path, plan: RunPlan, log: bool = False) -> Outcome:
    """One run under ``folder`` (made), the cluster torn down whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    history = folder / "history"
    history.mkdir(exist_ok=True)
    say = print if log else (lambda *_: None)
    cluster = HostCluster(folder / "cluster", plan.spec)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        say("starting the cluster")
        cluster.start()
        _create_topics(cluster)
        t0 = time.monotonic()
        for name, role, host in WORKERS:
            argv = cluster.client_argv(host, _workload_argv(cluster, name, role, history, t0,
                                                            plan))  # fmt: skip
            with (folder / f"{name}.log").open("ab") as out:
                workers.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
        _wait_started(history, workers, folder)
        time.sleep(plan.warmup_s)
        _wait_for_work(history, workers, folder)
        recorder = Recorder(history / "nemesis.jsonl")
        nemesis = Nemesis(cluster, plan.seed, recorder, lambda: round(time.monotonic() - t0, 4))
        say(f"faults: {plan.faults}")
        try:
            nemesis.run(plan.faults, plan.hold_s, plan.quiet_s, lambda: False)
        finally:
            cluster.heal_all()
            recorder.close()
        say("healed; waiting for every service")
        cluster.wait_all_ready(timeout=120)
        time.sleep(plan.quiet_s)
        (history / "stop").touch()
        _reap(workers, timeout=90)
        say("final read")
        reads = _workload_argv(cluster, "final", "final", history, t0, plan)
        final = subprocess.run(
            cluster.client_argv("cl1", [*reads, "--deadline-s", str(plan.final_wait_s)]),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if final.returncode != 0:
            raise RuntimeError(f"the final read failed:\n{final.stdout}\n{final.stderr}")
    finally:
        _reap(workers, timeout=0)
        cluster.stop()
    events = read_history(history)
    report = check(events)
    summary = write_report(folder, events, report, seed=plan.seed, minutes=plan.minutes,
                           spec_text=repr(plan.spec))  # fmt: skip
    return Outcome(folder, events, report, summary)


#: How long the workloads may take to start and to commit their first transaction: on a
#: two-core machine loaded by the rest of the suite, starting Python with the SDK alone
#: was seen to take over ten seconds.
START_S = 120.0


def _wait_started(history: Path, workers: list[subprocess.Popen[bytes]], folder: Path) -> None:
    """Until every workload has started (its ``<name>.started`` file exists). The warmup
    and the faults count from there: a run whose clients were still importing when the
    stop file appeared did nothing and proved nothing (its checker found no anomaly in
    an empty history)."""
    names = [name for name, _role, _host in WORKERS]
    _wait_workers(
        lambda: all((history / f"{name}.started").exists() for name in names),
        workers,
        folder,
        "every workload to start",
    )


def _wait_for_work(history: Path, workers: list[subprocess.Popen[bytes]], folder: Path) -> None:
    """Until a producer has committed a transaction: the faults strike a cluster at work."""
    _wait_workers(
        lambda: any(
            isinstance(e, Txn) and e.kind == "produce" and e.outcome is TxnOutcome.OK
            for e in read_history(history)
        ),
        workers,
        folder,
        "a first committed transaction",
    )


def _wait_workers(
    condition: Callable[[], bool],
    workers: list[subprocess.Popen[bytes]],
    folder: Path,
    what: str,
) -> None:
    """Poll ``condition`` until it holds; fail with the workloads' logs at the deadline or
    as soon as one of them has exited."""
    deadline = time.monotonic() + START_S
    while not condition():
        exited = [w for w in workers if w.poll() is not None]
        if exited or time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {name}.log\n{(folder / f'{name}.log').read_text(errors='replace')[-2000:]}"
                for name, _role, _host in WORKERS
            )
            reason = "a workload exited" if exited else f"not within {START_S:.0f}s"
            raise RuntimeError(f"waiting for {what}: {reason}\n{tails}")
        time.sleep(0.2)


def _reap(workers: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Wait for the workloads to stop by themselves, then kill what is left."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="of faults (at least one each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("jepsen-runs"))
    args = parser.parse_args(argv)
    plan = plan_for(args.seed, args.minutes)
    folder = args.out / f"seed-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    outcome = run(folder, plan, log=True)
    print(outcome.summary.read_text())
    print(f"report: {outcome.folder}")
    return 0 if outcome.report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
