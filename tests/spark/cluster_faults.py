"""The transform of the standalone-cluster test, named on the command line as
``--transform tests.spark.cluster_faults:tag_with_faults`` (so the real ``eos spark run``
loads it, and the executors import it from the repository on their ``PYTHONPATH``).

It tags like ``helpers.tag_to`` (``v`` -> ``out:v``, same key and partition) and plants
two faults, each on the first attempt of a task, at one source record ``partition:offset``
(so in one batch only). The test runs in another process than the executors, so the
attempts tell it where they are with files in ``marks``:

* every attempt passing a planted record leaves ``reached-<partition>-<offset>-<attempt>-<pid>``;
* ``slow``: the first attempt stops at its record until another attempt of its task has
  passed the same record (Spark's speculative copy, which ran ``init_transactions`` first
  and so fenced it), then goes on: its transaction is dead, it fails or is killed;
* ``stall``: the first attempt waits until its open transaction's records are on the node
  (the output partition's high watermark above its last stable offset), leaves
  ``stalled-<pid>`` and hangs, so that the test can SIGKILL its executor in the middle of
  the write. If nobody does within ``patience_s``, it raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from sdk import AdminClient, ConsumerRecord, TopicPartition
from spark_jobs.transforms import OutputRecord

STALLED = "stalled-"


def _attempt() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.attemptNumber())


def _point(spec: str) -> tuple[int, int] | None:
    """``"1:60"`` -> ``(1, 60)``; ``""`` -> None."""
    if not spec:
        return None
    partition, offset = spec.split(":")
    return int(partition), int(offset)


class TagWithFaults:
    """``v`` -> ``out:v`` in ``topic``, with the planted faults of the module."""

    def __init__(
        self,
        topic: str,
        bootstrap: str,
        marks: Path,
        slow: tuple[int, int] | None,
        stall: tuple[int, int] | None,
        patience_s: float,
    ) -> None:
        self.topic = topic
        self.bootstrap = bootstrap
        self.marks = marks
        self.slow = slow
        self.stall = stall
        self.patience_s = patience_s

    def __call__(self, record: ConsumerRecord) -> Iterable[OutputRecord]:
        point = (record.partition, record.offset)
        if point in (self.slow, self.stall):
            attempt = _attempt()
            (self.marks / f"reached-{point[0]}-{point[1]}-{attempt}-{os.getpid()}").touch()
            if attempt == 0 and point == self.slow:
                self._wait_for_another_attempt(point)
            if attempt == 0 and point == self.stall:
                self._stall(record.partition)
        return (OutputRecord(self.topic, f"out:{record.value!s}", record.key, record.partition),)

    def _wait_for_another_attempt(self, point: tuple[int, int]) -> None:
        """Until a later attempt passes ``point``; at the deadline, go on regardless (the
        test then finds no speculative attempt in the event log, and fails)."""
        prefix = f"reached-{point[0]}-{point[1]}-"
        deadline = time.monotonic() + self.patience_s
        while time.monotonic() < deadline:
            attempts = {p.name.removeprefix(prefix).split("-")[0]
                        for p in self.marks.glob(f"{prefix}*")}  # fmt: skip
            if attempts - {"0"}:
                return
            time.sleep(0.05)

    def _stall(self, partition: int) -> None:
        tp = TopicPartition(self.topic, partition)
        deadline = time.monotonic() + self.patience_s
        with AdminClient(self.bootstrap) as admin:
            while (offsets := admin.list_offsets(tp)).high_watermark <= offsets.last_stable_offset:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no open transaction's records in {tp}: {offsets}")
                time.sleep(0.05)
        (self.marks / f"{STALLED}{os.getpid()}").touch()
        time.sleep(self.patience_s)  # the hung task: its executor is killed meanwhile
        raise RuntimeError(f"the stalled attempt on {tp} was not killed in {self.patience_s}s")


def tag_with_faults(
    topic: str, bootstrap: str, marks: str, slow: str = "", stall: str = "",
    patience_s: str = "90",
) -> TagWithFaults:  # fmt: skip
    """The factory ``--transform`` names; every ``--option`` arrives as text."""
    return TagWithFaults(
        topic, bootstrap, Path(marks), _point(slow), _point(stall), float(patience_s)
    )
