"""The local session's Python workers fork from ``spark_jobs.worker_daemon``, which imported
the SDK and the data source before its first fork, and started no thread doing so."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def test_a_local_sessions_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "spark_jobs.worker_daemon"

    def where(_rows: Any) -> Any:
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            yield (cmdline.read().replace(b"\0", b" ").decode(), "sdk" in sys.modules)

    found = spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect()
    assert found and all("spark_jobs.worker_daemon" in parent for parent, _ in found), found
    assert all(preloaded for _, preloaded in found), found


def test_the_daemon_imports_start_no_thread_and_leave_pyarrow_to_the_workers() -> None:
    """A fork copies the forking thread alone, and pyarrow may start threads on import."""
    code = (
        "import sys, threading; import spark_jobs.worker_daemon; "
        "print(threading.active_count(), 'pyarrow' in sys.modules, 'sdk' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False", "True"], out.stdout + out.stderr
