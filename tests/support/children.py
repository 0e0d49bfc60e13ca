"""Processes a test starts itself (drivers, workers, ``eos up``, an earlier release), each
stopped and reaped when the test ends, on every path: the ``children`` fixture
(``tests/conftest.py``), not a ``finally`` in each test.

A process left running holds its ports and files, and one left unreaped is reported by
the interpreter as a ``ResourceWarning`` in whatever test runs next (warnings are errors
here). Stopping is gentle first — SIGTERM, so that a supervisor such as ``eos up`` stops
its own services — then SIGKILL, to the whole process group when the child was started in
a session of its own (a Spark driver with its JVM and Python workers).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: How long a child may take to stop after SIGTERM before it is killed.
GRACE_S = 30.0


class Children:
    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._started: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: Sequence[str], *, log: Path | None = None, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv, **kwargs)``, its output appended to ``log`` if given."""
        if log is None:
            process = subprocess.Popen(list(argv), **kwargs)
        else:
            with log.open("ab") as out:
                process = subprocess.Popen(
                    list(argv), stdout=out, stderr=subprocess.STDOUT, **kwargs
                )
        self._started.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> int:
        """SIGKILL ``process`` (its group, if it leads one) and reap it; its exit code."""
        if process.poll() is None:
            _signal(process, signal.SIGKILL)
        return process.wait(timeout=GRACE_S)

    def stop(self, process: subprocess.Popen[bytes], grace_s: float | None = None) -> int:
        """SIGTERM, then SIGKILL after ``grace_s`` (default: this stopper's); reaped
        either way. Its exit code."""
        if process.poll() is None:
            _signal(process, signal.SIGTERM)
            try:
                return process.wait(timeout=self.grace_s if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                pass
        return self.kill(process)

    def close(self) -> None:
        """Stop every child still running, newest first, and reap them all."""
        errors: list[BaseException] = []
        for process in reversed(self._started):
            try:
                self.stop(process)
            except (OSError, subprocess.TimeoutExpired) as exc:  # stop the others anyway
                errors.append(exc)
        self._started.clear()
        if errors:
            raise errors[0]


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        if os.getpgid(process.pid) == process.pid:  # started with start_new_session
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
    except ProcessLookupError:
        pass  # gone between the poll and the signal: wait() reaps it
