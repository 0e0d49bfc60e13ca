"""The chaos workload: a seeded input topic, one copier process per input partition, one
read_committed reader process, a supervisor that restarts what dies, and at the end the
gathered ``History`` for the checker.

The supervisor is the copiers' orchestrator, as a Kafka Streams or Spark driver would be:
a copier that exits (fenced, crashed, killed) is started again as a new instance with the
same transactional id, unless a fault holds it (a paused zombie is not replaced behind the
fault's back). The faults run in the test's thread and only use the methods here.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eos_cli.launcher import SPAWNER, ChildProcess
from sdk import AdminClient, Consumer, Producer, TopicPartition
from tests.chaos.history import (
    History,
    copier_history_path,
    load_copiers,
    read_events,
    reads_from_events,
)
from tests.support.cluster import Cluster
from tests.support.processes import wait_until


@dataclass(frozen=True)
class WorkloadConfig:
    records: int
    partitions: int = 3
    txn_min: int = 100
    txn_max: int = 300
    abort_every: int = 3
    txn_timeout_ms: int = 15_000
    seed: int = 7
    deadline_s: float = 240.0
    pace: float = 0.0  # records per second and copier, 0: as fast as it goes


@dataclass
class CopierSlot:
    """The copier of one input partition: its current process and what became of the
    earlier ones (exit codes by instance)."""

    partition: int
    process: ChildProcess | None = None
    instance: int = -1
    held: bool = False
    done: bool = False
    exits: dict[int, int] = field(default_factory=dict)


class Workload:
    def __init__(self, cluster: Cluster, directory: Path, config: WorkloadConfig) -> None:
        self.cluster = cluster
        self.dir = directory
        self.config = config
        run = uuid.uuid4().hex[:8]
        self.input = f"chaos-in-{run}"
        self.output = f"chaos-out-{run}"
        self.group_prefix = f"chaos-{run}"
        self.tid_prefix = f"chaos-copier-{run}"
        self.inputs: dict[int, list[str]] = {}
        self.slots = {p: CopierSlot(p) for p in range(config.partitions)}
        self.reader: ChildProcess | None = None
        self.lock = threading.RLock()  # the supervisor's, and a fault's taking a copier over
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        directory.mkdir(parents=True, exist_ok=True)

    # --- names ---------------------------------------------------------------------------

    def tid(self, partition: int) -> str:
        return f"{self.tid_prefix}-{partition}"

    def group(self, partition: int) -> str:
        return f"{self.group_prefix}-{partition}"

    def history_path(self, partition: int, instance: int) -> Path:
        return copier_history_path(self.dir, partition, instance)

    # --- set up --------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create both topics, write the input and read it back (the copies' reference)."""
        url, parts = self.cluster.bootstrap(), self.config.partitions
        with AdminClient(url) as admin:
            admin.create_topics({self.input: parts, self.output: parts})
        rng = random.Random(self.config.seed)
        with Producer(url, linger_ms=20) as producer:
            for i in range(self.config.records):
                p = i % parts
                value = f"v{p}.{i // parts}.{rng.getrandbits(40):010x}"
                producer.send(self.input, value, key=f"k{i}", partition=p)
            producer.flush()
        self.inputs = {p: [r for _, r in self.read_all(self.input, p)] for p in range(parts)}
        assert sum(len(v) for v in self.inputs.values()) == self.config.records

    def read_all(self, topic: str, partition: int) -> list[tuple[int, str]]:
        """Every committed record of one partition, from offset 0 to its end."""
        tp = TopicPartition(topic, partition)
        with AdminClient(self.cluster.bootstrap()) as admin:
            end = admin.list_offsets(tp).last_stable_offset
        found: list[tuple[int, str]] = []
        with Consumer(self.cluster.bootstrap(), max_poll_records=5000) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while consumer.position(tp) < end:
                found += [(r.offset, str(r.value)) for r in consumer.poll(timeout=1.0)]
        return found

    def start(self) -> None:
        self.reader = self._spawn(
            "tests.chaos.reader",
            [
                "--url", self.cluster.bootstrap(1),
                "--topic", self.output,
                "--partitions", str(self.config.partitions),
                "--history", str(self.dir / "reader.jsonl"),
                "--stop", str(self.dir / "stop.json"),
            ],
            "reader.log",
        )  # fmt: skip
        for slot in self.slots.values():
            self.start_copier(slot.partition)
        self._supervisor.start()

    # --- copiers -------------------------------------------------------------------------

    def _spawn(self, module: str, args: list[str], log: str) -> ChildProcess:
        """``python -m module args``, forked from the worker's zygote when it has one
        (``tests/support/zygote.py``: the SDK is imported there once), else by ``Popen``."""
        argv = [sys.executable, "-m", module, *args]
        for spawn in SPAWNER:
            if (process := spawn(argv, dict(os.environ), self.dir / log, False)) is not None:
                return process
        with open(self.dir / log, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def start_copier(self, partition: int) -> int:
        """Start a new instance of the partition's copier; returns its instance number.
        An earlier process still alive (a paused zombie) is left as it is."""
        c = self.config
        with self.lock:
            slot = self.slots[partition]
            slot.instance += 1
            instance = slot.instance
            # The first instance knows what the spec gives clients (with an entry, that one
            # coordinator: it must learn the others). A later one starts from every
            # coordinator, as a client restarted with a full bootstrap list: one that knew
            # only a stopped entry could never learn the survivor (no more than a Kafka
            # client whose one bootstrap server is down), and would wait for the entry,
            # which a failover fault brings back only once commits have resumed.
            url = (
                self.cluster.bootstrap(partition) if instance == 0
                else self.cluster.every_coordinator()
            )  # fmt: skip
            slot.process = self._spawn(
                "tests.chaos.copier",
                [
                    "--url", url,
                    "--input", self.input, "--output", self.output,
                    "--group", self.group(partition), "--tid", self.tid(partition),
                    "--history", str(self.history_path(partition, instance)),
                    "--partition", str(partition), "--instance", str(instance),
                    "--end", str(len(self.inputs[partition])),
                    "--txn-min", str(c.txn_min), "--txn-max", str(c.txn_max),
                    "--abort-every", str(c.abort_every), "--timeout-ms", str(c.txn_timeout_ms),
                    "--seed", str(c.seed), "--pace", str(c.pace),
                    "--coordinator-timeout-ms",
                    str(self.cluster.spec.coordinator_timeout_ms),
                ],
                f"copier-{partition}.log",
            )  # fmt: skip
            return instance

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                for slot in self.slots.values():
                    if slot.held or slot.done or slot.process is None:
                        continue
                    code = slot.process.poll()
                    if code is None:
                        continue
                    slot.exits[slot.instance] = code
                    if code == 0:
                        slot.done = True
                    else:
                        self.start_copier(slot.partition)

    def restarts(self) -> int:
        return sum(slot.instance for slot in self.slots.values())

    def last_event(self, partition: int, instance: int) -> str | None:
        """The kind of the copier instance's latest event (reads only the file's tail)."""
        path = self.history_path(partition, instance)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 512))
                tail = f.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(tail):
            if line.startswith('{"e":"'):
                return line[6:].split('"', 1)[0]
        return None

    # --- progress and the end ------------------------------------------------------------

    def copied(self) -> int:
        """Input records whose copies are committed (the groups' committed offsets);
        best effort while faults are on: what could not be asked counts as nothing."""
        total = 0
        for p in self.slots:
            try:
                with Consumer(self.cluster.bootstrap(p), self.group(p)) as consumer:
                    found = consumer.committed(
                        [(self.input, p)], require_stable=False, timeout=2.0
                    ).get(TopicPartition(self.input, p))
            except Exception:
                continue
            total += found.offset if found else 0
        return total

    def wait_copied(self, fraction: float) -> None:
        target = fraction * self.config.records
        wait_until(
            lambda: self.all_done() or self.copied() >= target,
            timeout=self.config.deadline_s,
            interval=0.3,
            what=f"{fraction:.0%} of the input copied",
        )

    def all_done(self) -> bool:
        with self.lock:
            return all(slot.done for slot in self.slots.values())

    def finish(self) -> History:
        """Wait for the copiers to finish and the reader to read everything, read the
        output and the committed offsets back, and gather the history."""
        wait_until(self.all_done, timeout=self.config.deadline_s, interval=0.2,
                   what="every copier to finish")  # fmt: skip
        ends = self._stable_ends()
        (self.dir / "stop.json").write_text(
            "{" + ",".join(f'"{p}":{end}' for p, end in ends.items()) + "}"
        )
        assert self.reader is not None
        self.reader.wait(timeout=self.config.deadline_s)
        assert self.reader.returncode == 0, (self.dir / "reader.log").read_text()[-2000:]
        output = {p: self.read_all(self.output, p) for p in self.slots}
        committed: dict[int, int | None] = {}
        for p in self.slots:
            with Consumer(self.cluster.bootstrap(), self.group(p)) as consumer:
                found = consumer.committed([(self.input, p)], timeout=30.0)
            offset = found.get(TopicPartition(self.input, p))
            committed[p] = offset.offset if offset else None
        reads = list(reads_from_events(read_events(self.dir / "reader.jsonl")))
        return History(self.inputs, load_copiers(self.dir), reads, output, committed)

    def _stable_ends(self) -> dict[int, int]:
        """The output's end offsets once no transaction is open on it (LSO = HW)."""
        ends: dict[int, int] = {}

        def stable() -> bool:
            with AdminClient(self.cluster.bootstrap()) as admin:
                for p in self.slots:
                    o = admin.list_offsets((self.output, p), timeout=10.0)
                    if o.last_stable_offset != o.high_watermark:
                        return False
                    ends[p] = o.high_watermark
            return True

        wait_until(stable, timeout=60, interval=0.2, what="the output to become stable")
        return ends

    def tails(self, lines: int = 12) -> str:
        """The last events of every copier's history and the last lines of every client's
        log, for a failure message: what the clients were doing when the run went wrong."""
        parts = []
        for path in sorted([*self.dir.glob("copier-*.jsonl"), *self.dir.glob("*.log")]):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def reader_errors(self) -> int:
        return sum(1 for e in read_events(self.dir / "reader.jsonl") if e["e"] == "error")

    def stop(self) -> None:
        """Stop the supervisor and every process it started (SIGCONT first: a paused
        process cannot act on anything else)."""
        self._stop.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=10)
        processes = [self.reader] + [slot.process for slot in self.slots.values()]
        for process in processes:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def describe_txn(url: str, tid: str) -> dict[str, object] | None:
    """The coordinator's description of a transactional id, None if it cannot say now."""
    try:
        answer = httpx.get(f"{url}/v1/transactions/{tid}", timeout=5.0)
    except httpx.HTTPError:
        return None
    return dict(answer.json()) if answer.status_code == 200 else None


def wait_for(what: str, condition: object, timeout: float) -> None:
    """``wait_until`` for conditions that may raise while services restart."""
    assert callable(condition)

    def safe() -> bool:
        try:
            return bool(condition())
        except (httpx.HTTPError, OSError):
            return False

    wait_until(safe, timeout=timeout, interval=0.05, what=what)
