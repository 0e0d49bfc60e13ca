"""What a Spark application did, read from its event log (``spark.eventLog.enabled``).

A test that plants a fault in a Spark job must show from Spark's own records that the
fault happened, not assume it: that a speculative copy of a task really ran, that the
executor it killed really was lost and its task run again elsewhere. The event log is
JSON lines, one listener event each; with ``spark.eventLog.rolling.enabled`` (the default
since Spark 4) an application's log is a directory ``eventlog_v2_<app>`` of
``events_<n>_<app>`` files, else a single file ``<app>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt of a task, from the ``Task Info`` of its start or end event.
    ``reason`` is the end's (``Success``, ``ExecutorLostFailure``, ``TaskKilled``, ...),
    None at the start."""

    stage: int
    index: int
    attempt: int
    executor: str
    host: str
    speculative: bool
    reason: str | None = None

    @classmethod
    def of(cls, event: dict[str, Any]) -> TaskAttempt:
        info = event["Task Info"]
        ended = event.get("Task End Reason")
        return cls(
            stage=int(event["Stage ID"]), index=int(info["Index"]),
            attempt=int(info["Attempt"]), executor=str(info["Executor ID"]),
            host=str(info["Host"]), speculative=bool(info["Speculative"]),
            reason=None if ended is None else str(ended["Reason"]),
        )  # fmt: skip


class EventLog:
    """The events of one application's log."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    @classmethod
    def read(cls, directory: Path) -> EventLog:
        """The one application's log in ``directory`` (``spark.eventLog.dir``)."""
        logs = [p for p in directory.iterdir() if not p.name.startswith(".")]
        if len(logs) != 1:
            raise LookupError(f"one application's event log expected in {directory}: {logs}")
        (log,) = logs
        if log.is_dir():
            parts = sorted(log.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
        else:
            parts = [log]
        return cls([json.loads(line) for p in parts for line in p.read_text().splitlines()])

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("Event") == kind]

    def started(self) -> list[TaskAttempt]:
        return [TaskAttempt.of(e) for e in self._of("SparkListenerTaskStart")]

    def ended(self) -> list[TaskAttempt]:
        return [TaskAttempt.of(e) for e in self._of("SparkListenerTaskEnd")]

    def speculative(self) -> list[TaskAttempt]:
        """Attempts started as speculative copies of a running one."""
        return [t for t in self.started() if t.speculative]

    def removed_executors(self) -> dict[str, str]:
        """Executor id -> why the driver removed it."""
        return {
            str(e["Executor ID"]): str(e.get("Removed Reason", ""))
            for e in self._of("SparkListenerExecutorRemoved")
        }

    def lost_with(self, executor: str) -> list[TaskAttempt]:
        """Attempts that ended because ``executor`` was lost."""
        return [
            t for t in self.ended() if t.reason == "ExecutorLostFailure" and t.executor == executor
        ]
