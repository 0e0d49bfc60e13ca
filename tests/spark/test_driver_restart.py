"""A driver killed with SIGKILL while the job runs (with its JVM and Python workers: the
whole process group, as when a driver host dies) and started again: the new driver plans
from the committed offsets, its tasks' ``init_transactions`` abort what the dead ones left
open, and the output holds every input exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdk import Consumer, TopicPartition
from spark_jobs.check import check_topics, offsets_at_end
from tests.sdk.helpers import wait_for
from tests.spark.helpers import produce_numbers, uid, untag
from tests.support.children import Children
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time

INPUT = 600


def _driver(
    children: Children, cluster: Cluster, args: list[str], log: Path
) -> subprocess.Popen[bytes]:
    """The pipeline's driver in a session of its own, so that a kill takes its JVM and
    Python workers with it (``children`` signals the whole group)."""
    return children.start(
        [sys.executable, "-m", "spark_jobs.eos_pipeline", "run", "--bootstrap", cluster.url,
         *args],
        log=log, start_new_session=True,
    )  # fmt: skip


def _committed(cluster: Cluster, source: str, group: str) -> int:
    with Consumer(cluster.url, group) as consumer:
        found = consumer.committed([TopicPartition(source, p) for p in range(2)],
                                   require_stable=False)
    return sum(om.offset for om in found.values() if om is not None)


@pytest.mark.slow
def test_a_driver_killed_mid_run_and_restarted_delivers_exactly_once(
    cluster: Cluster, tmp_path: Path, children: Children
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
    first = _driver(children, cluster, args, log)
    # a JVM's start on a loaded two-core machine has taken over a minute
    wait_for(lambda: first.poll() is not None or _committed(cluster, source, app) > 0,
             timeout=180, what="the first batch to commit")
    assert first.poll() is None, log.read_text()[-3000:]
    children.kill(first)
    done = _committed(cluster, source, app)
    assert 0 < done < INPUT, "killed between the first and the last batch"

    second = _driver(children, cluster, args, log)
    assert second.wait(timeout=180) == 0, log.read_text()[-3000:]
    report = check_topics(cluster.url, [sink], values, untag)
    assert report.ok, report
    offsets = offsets_at_end(cluster.url, source, app)
    assert all(c == end for c, end in offsets.values()), offsets
