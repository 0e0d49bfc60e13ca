"""The ``format("eos")`` sink when the driver is SIGKILLed (with its JVM and workers) at
each point of a micro-batch, and restarted from the same checkpoint by a new process (one
query, killed at each point in turn: four JVMs rather than six):

(a) while the batch's tasks write (one task blocks in a UDF, the other has written);
(b) after every task wrote, before the EOS commit (the sink's test seam);
(c) after the EOS commit, before Spark's commit log (the seam): Spark replays the batch.

Each time the output holds the input exactly once, and at the moment of the kill a
read_committed reader shows nothing of the batch that did not finish (its records are on
the node, undecided, in (a) and (b)). Each point is shown to have been hit by a marker
written just before the kill.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sdk import Consumer
from spark_jobs.check import read_all
from spark_jobs.datasource.stream_write import KILL_AT_ENV, KILL_MARKER_ENV, record_entry
from tests.sdk.helpers import wait_for
from tests.spark.datasource_driver import BLOCK_MARKER_ENV
from tests.spark.helpers import produce_numbers, uid
from tests.support.children import Children
from tests.support.cluster import Cluster

# The streaming lane: beside the "spark" lane, one JVM at a time each (docs/testing.md)
pytestmark = pytest.mark.xdist_group("spark-streaming")

INPUT = 60
PER_BATCH = 20
JVM_START_S = 240.0  # a JVM's start on a loaded two-core machine has taken over a minute
#: A test that starts two drivers, each a JVM: more than the suite's 300 s under load.
TWO_DRIVERS_TIMEOUT_S = 600
FOUR_DRIVERS_TIMEOUT_S = 1000


def start_driver(
    children: Children, cluster: Cluster, args: list[str], log: Path, **env: str
) -> subprocess.Popen[bytes]:
    """``tests.spark.datasource_driver`` in a session of its own, so that a kill (the
    seam's or ``children``'s) takes its JVM and Python workers with it."""
    return children.start(
        [sys.executable, "-m", "tests.spark.datasource_driver", *args,
         "--bootstrap", cluster.url],
        log=log, start_new_session=True, env={**os.environ, **env},
    )  # fmt: skip


def recorded(cluster: Cluster, prefix: str) -> int | None:
    """The sink's record of the next batch to write (None: none committed)."""
    with Consumer(cluster.url, prefix) as consumer:
        found = consumer.committed([record_entry(prefix)])[record_entry(prefix)]
    return None if found is None else found.offset


def visible(cluster: Cluster, sink: str, isolation_level: str = "read_committed") -> list[str]:
    records = read_all(cluster.url, sink, isolation_level=isolation_level)
    return [str(r.value).removeprefix("out:") for r in records]


@pytest.mark.timeout(FOUR_DRIVERS_TIMEOUT_S)
def test_a_driver_killed_at_each_point_of_a_batch_and_restarted_writes_exactly_once(
    cluster: Cluster, tmp_path: Path, children: Children
) -> None:
    """One query, four drivers: the first three are killed in batch 0 at (a), (b), (c) in
    turn, each restarted from the checkpoint the one before left; the fourth ends it."""
    source = cluster.create_topic(partitions=2, prefix="dk-in")
    sink = cluster.create_topic(partitions=2, prefix="dk-out")
    values = produce_numbers(cluster.url, source, INPUT)
    prefix, log = uid("dk-query"), tmp_path / "driver.log"
    args = ["copy", "--source", source, "--sink", sink, "--prefix", prefix,
            "--checkpoint", str(tmp_path / "ck"), "--max-records", str(PER_BATCH)]  # fmt: skip

    # (a) one task of batch 0 blocks in a UDF while the other writes into the transaction
    marker = tmp_path / "blocked"
    first = start_driver(children, cluster, args, log, **{BLOCK_MARKER_ENV: str(marker)})
    wait_for(lambda: first.poll() is not None or marker.exists(),
             timeout=JVM_START_S, what="a task of batch 0 to block")  # fmt: skip
    assert first.poll() is None, log.read_text()[-3000:]
    wait_for(lambda: visible(cluster, sink, "read_uncommitted"), timeout=60,
             what="the unblocked task to write")  # fmt: skip
    children.kill(first)
    assert marker.read_text().startswith("blocked")
    assert_batch_0_undecided(cluster, sink, prefix)

    # (b) every task wrote, the EOS commit not yet made
    killed_at(children, cluster, args, log, tmp_path / "b", "after_tasks")
    assert_batch_0_undecided(cluster, sink, prefix)

    # (c) the EOS commit made, Spark's commit log not written: Spark replays batch 0
    killed_at(children, cluster, args, log, tmp_path / "c", "after_eos_commit")
    committed = visible(cluster, sink)
    assert recorded(cluster, prefix) == 1  # batch 0 committed, with its record
    assert len(committed) == PER_BATCH and set(committed) <= set(values)
    assert not (tmp_path / "ck" / "commits" / "0").exists()

    last = start_driver(children, cluster, args, log)
    assert last.wait(timeout=JVM_START_S) == 0, log.read_text()[-3000:]
    assert Counter(visible(cluster, sink)) == Counter(values)
    assert recorded(cluster, prefix) == INPUT // PER_BATCH


def killed_at(
    children: Children, cluster: Cluster, args: list[str], log: Path, marker: Path, point: str
) -> None:
    """A driver run with the sink's seam set to kill it at ``point``: it dies there, in
    batch 0."""
    env = {KILL_AT_ENV: point, KILL_MARKER_ENV: str(marker)}
    driver = start_driver(children, cluster, args, log, **env)
    assert driver.wait(timeout=JVM_START_S) != 0, log.read_text()[-3000:]
    assert marker.read_text().split() == [point, "0"], "killed at the seam, in batch 0"


def assert_batch_0_undecided(cluster: Cluster, sink: str, prefix: str) -> None:
    """Batch 0's records are on the node, undecided, and invisible to read_committed."""
    assert recorded(cluster, prefix) is None
    assert visible(cluster, sink) == []
    assert visible(cluster, sink, "read_uncommitted")
