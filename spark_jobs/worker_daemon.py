"""PySpark's worker daemon with the EOS modules imported before it forks, and with its
kills confined to its own workers.

Spark starts Python work through a daemon (``pyspark.daemon``) that forks one process per
worker, and each fork then imports what its task needs: a ``format("eos")`` task imported
the SDK, pydantic and httpx again in every Python worker. Imported once here, before the
daemon's first fork, every worker inherits them.

Only modules that start no thread when imported belong here: a fork copies the importing
thread alone (that is why ``pyspark.daemon`` itself leaves pandas and pyarrow to the
workers). ``build_session`` names this module (``spark.python.daemon.module``) for local
masters, whose executors run this interpreter; a cluster's executors keep Spark's own
daemon unless told otherwise.

The daemon SIGKILLs whatever pid the JVM names when it gives up on a worker. A worker
that had died already was reaped by the daemon, and its pid may by then belong to any
process of the machine (Linux hands pids out again once the counter wraps, at 32,768 by
default): here the pid is killed only while it is still one of this daemon's children.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

# imported for the forks that follow: the worker's own loop, the data source's tasks and
# the batch job's
import pyspark.daemon
import pyspark.worker

import spark_jobs.datasource.batch_read
import spark_jobs.datasource.batch_write
import spark_jobs.datasource.stream_read
import spark_jobs.datasource.stream_write
import spark_jobs.datasource.task_write
import spark_jobs.eos_pipeline  # noqa: F401  (for the forks, as above)


def is_child(pid: int) -> bool:
    """Whether ``pid`` is a process this one started and has not reaped (Linux's
    ``/proc``; elsewhere every pid is taken for one, as ``pyspark.daemon`` does)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # no /proc: cannot tell
    except OSError:
        return False
    return int(fields[1]) == os.getpid()


class _OwnWorkersOnly:
    """``os`` for ``pyspark.daemon``, except that a SIGKILL of a single pid reaches it
    only while it is this daemon's child."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def kill(pid: int, sig: int) -> None:
        if sig == signal.SIGKILL and pid > 0 and not is_child(pid):
            raise ProcessLookupError(pid, "not a worker of this daemon")
        os.kill(pid, sig)


def main() -> None:
    if threading.active_count() != 1:  # an import above started a thread: fork without it
        raise RuntimeError("spark_jobs.worker_daemon: a preloaded module started a thread")
    setattr(pyspark.daemon, "os", _OwnWorkersOnly())  # noqa: B010  (the module's own name for os)
    pyspark.daemon.manager()


if __name__ == "__main__":
    main()
