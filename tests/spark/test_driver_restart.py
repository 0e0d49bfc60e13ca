"""A driver killed with SIGKILL while the job runs (with its JVM and Python workers: the
whole process group, as when a driver host dies) and started again: the new driver plans
from the committed offsets, its tasks' ``init_transactions`` abort what the dead ones left
open, and the output holds every input exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdk import Consumer, TopicPartition
from spark_jobs.check import check_topics, offsets_at_end
from tests.sdk.helpers import wait_for
from tests.spark.helpers import produce_numbers, uid, untag
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time

INPUT = 600


def _driver(cluster: Cluster, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "spark_jobs.eos_pipeline", "run",
             "--bootstrap", cluster.url, *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _kill(driver: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver's whole process group (JVM and Python workers) and reap it."""
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)


def _committed(cluster: Cluster, source: str, group: str) -> int:
    with Consumer(cluster.url, group) as consumer:
        found = consumer.committed([TopicPartition(source, p) for p in range(2)],
                                   require_stable=False)
    return sum(om.offset for om in found.values() if om is not None)


@pytest.mark.slow
def test_a_driver_killed_mid_run_and_restarted_delivers_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    source = cluster.create_topic(partitions=2, prefix="in")
    sink = cluster.create_topic(partitions=2, prefix="out")
    values = produce_numbers(cluster.url, source, INPUT)
    app = uid("restart")
    args = [
        "--app", app, "--source", source,
        "--transform", "tests.spark.helpers:tag_to", "--option", f"topic={sink}",
        "--master", "local[2]", "--max-batch-records", "30",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
    ]
    log = tmp_path / "driver.log"
    first = _driver(cluster, args, log)
    try:
        # a JVM's start on a loaded two-core machine has taken over a minute
        wait_for(lambda: first.poll() is not None or _committed(cluster, source, app) > 0,
                 timeout=180, what="the first batch to commit")
        assert first.poll() is None, log.read_text()[-3000:]
    finally:
        _kill(first)
    done = _committed(cluster, source, app)
    assert 0 < done < INPUT, "killed between the first and the last batch"

    second = _driver(cluster, args, log)
    try:
        assert second.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        _kill(second)
    report = check_topics(cluster.url, [sink], values, untag)
    assert report.ok, report
    offsets = offsets_at_end(cluster.url, source, app)
    assert all(c == end for c, end in offsets.values()), offsets
