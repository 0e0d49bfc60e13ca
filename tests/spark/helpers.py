"""Inputs, transforms and planted faults for the Spark tests.

The faults are functions Spark ships to the executors (pickled by reference, so this
module is imported there): they act on the first attempt of a task only, as a crash that a
retry recovers from.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk import ConsumerRecord, Producer, TopicPartition
from spark_jobs.eos_pipeline import TaskProgress
from spark_jobs.transforms import OutputRecord, RecordTransform


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce_numbers(url: str, topic: str, count: int, start: int = 0) -> list[str]:
    """Values ``"start" .. "start+count-1"`` keyed alike; returns the values."""
    values = [str(i) for i in range(start, start + count)]
    with Producer(url, linger_ms=2) as producer:
        for value in values:
            producer.send(topic, value, key=f"k{value}")
        producer.flush()
    return values


def tag_to(topic: str) -> RecordTransform:
    """``v`` -> ``out:v`` in ``topic``, same key and partition."""

    def transform(record: ConsumerRecord) -> Iterable[OutputRecord]:
        return (OutputRecord(topic, f"out:{record.value!s}", record.key, record.partition),)

    return transform


def untag(record: ConsumerRecord) -> str:
    return str(record.value).removeprefix("out:")


class FailFirstAttempt:
    """On the first attempt of a task, after ``after`` records: flush what was sent (so
    part of the output really is on the node) and raise."""

    def __init__(self, after: int, partitions: tuple[int, ...] = (0,)) -> None:
        self.after = after
        self.partitions = partitions

    def __call__(self, progress: TaskProgress) -> None:
        if (
            progress.attempt == 0
            and progress.tp.partition in self.partitions
            and progress.records == self.after
        ):
            progress.flush()
            raise RuntimeError(f"planted fault in {progress.tp} after {self.after} records")


class KillWorkerFirstAttempt(FailFirstAttempt):
    """The same point, but the Python worker process dies of SIGKILL."""

    def __call__(self, progress: TaskProgress) -> None:
        if (
            progress.attempt == 0
            and progress.tp.partition in self.partitions
            and progress.records == self.after
        ):
            progress.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class SlowFirstAttempt:
    """Attempt 0 of partition 0 dawdles (so speculation may start a copy); every attempt
    notes itself in ``log_dir``."""

    def __init__(self, log_dir: Path, delay_s: float) -> None:
        self.log_dir = log_dir
        self.delay_s = delay_s

    def __call__(self, progress: TaskProgress) -> None:
        if progress.records == 1:
            (self.log_dir / f"{progress.tp.partition}-{progress.attempt}-{os.getpid()}").touch()
        if progress.attempt == 0 and progress.tp.partition == 0 and progress.records % 20 == 0:
            progress.flush()
            time.sleep(self.delay_s)


def fail_write_first_attempt(tp: TopicPartition, batch: int) -> None:
    """An ``after_batch`` hook for the writer: the first attempt of the task that owns
    partition 0 dies after its second batch."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if tp.partition == 0 and batch == 1 and context is not None and context.attemptNumber() == 0:
        raise RuntimeError("planted fault in the writer")


def fail_write_always(tp: TopicPartition, batch: int) -> None:
    """Every attempt of the task of partition 0 dies after its third batch."""
    if tp.partition == 0 and batch == 2:
        raise RuntimeError("planted permanent fault in the writer")


#: Spark gives the Python process of a streaming source a fixed 10 s to connect back
#: (``PythonWorkerFactory.createSimpleWorker``, no setting); on a two-core machine loaded
#: by the rest of the suite it was seen to miss that, failing the query before its first
#: batch.
CONNECT_BACK = "Python worker failed to connect back"
START_ATTEMPTS = 3


def run_to_end(start: Callable[[], Any], timeout_s: float = 300) -> Any:
    """Start a query with ``start()``, wait until it ends (an ``availableNow`` trigger) and
    return it, stopped. A query that failed before its first batch because Spark's
    Python process did not connect back in time is started again from its checkpoint, as
    a user or a supervisor would (the sink is exactly once across restarts), at most
    ``START_ATTEMPTS`` times in all; any other failure is raised."""
    for attempt in range(1, START_ATTEMPTS + 1):
        query = start()
        error: BaseException | None
        try:
            query.awaitTermination(timeout_s)
            error = query.exception()
        except Exception as exc:  # the query's failure, raised by awaitTermination
            error = exc
        finally:
            query.stop()
        if error is None:
            return query
        retry = CONNECT_BACK in str(error) and not query.recentProgress
        if not retry or attempt == START_ATTEMPTS:
            raise AssertionError(f"the query failed: {error}") from error
    raise AssertionError("unreachable")
