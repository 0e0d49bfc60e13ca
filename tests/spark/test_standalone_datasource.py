"""Issue 30: ``writeStream.format("eos")`` on a Spark standalone cluster of real processes,
with speculation on and an executor SIGKILLed in the middle of a micro-batch's write.

The driver is ``tests.spark.datasource_standalone_job`` in a child process, on the cluster
of ``tests.support.spark_standalone`` (two workers on two loopback addresses, which Spark
takes for two hosts, one executor of one core each). The source has ``RECORDS`` records in
each of 2 partitions, read ``PER_TRIGGER`` per micro-batch (three batches, two tasks each):

* batch 0: the first attempt of the task of source partition 0 waits at ``SLOW`` until
  another attempt passes it. Once the other task has finished, Spark starts a speculative
  copy on the other host; both write the same batches in the task's slot under the
  batch's producer id and epoch, and the node drops the second copy's as duplicates;
* batch 1: the first attempt of sink task 1 stalls inside the sink once ``STALL_AFTER`` of
  its records are acknowledged by the node (in batches of ``WRITE_BATCH``, not sorted) and
  says so in a file; the test SIGKILLs that attempt's executor JVM and Spark runs the task
  again on another executor, which re-sends those batches with the same sequences (a
  speculative copy of it, if Spark starts one meanwhile, waits until the kill).

Both faults are proven from Spark's event log. The output, read read_committed, holds
every input exactly once; read read_uncommitted too: the dead attempts' records did reach
the node (the stall's mark holds the acknowledged count and the open transaction's
offsets), but as the same batches in the same slot, so not even an uncommitted second
copy exists (the older pipeline's test sees its aborted copies there instead).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk import Producer
from spark_jobs.check import check_topics, read_all
from tests.spark.datasource_standalone_job import (
    KILLED,
    MARKS_ENV,
    SLOW_ENV,
    STALL_ENV,
    STALLED,
)
from tests.spark.helpers import uid, untag
from tests.support.children import Children
from tests.support.cluster import Cluster
from tests.support.processes import wait_until
from tests.support.spark_event_log import EventLog
from tests.support.spark_standalone import StandaloneCluster

pytestmark = pytest.mark.xdist_group("spark")  # one Spark application at a time

RECORDS = 60  # per source partition
PER_TRIGGER = 40  # records per micro-batch: 20 from each partition, three batches
WRITE_BATCH = 5  # records per produce request of a sink task
SLOW = "0:10"  # batch 0: the first attempt of partition 0's task waits for its copy here
STALL_BATCH, STALL_TASK, STALL_AFTER = 1, 1, 10  # batch 1: sink task 1 hangs after 10
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",  # of 2 tasks: once one has finished
    "spark.speculation.minTaskRuntime": "500ms",
}


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    """A master and two workers, 127.0.0.2 and 127.0.0.3; killed whatever happens."""
    with StandaloneCluster(tmp_path / "spark", ("127.0.0.2", "127.0.0.3")) as spark:
        yield spark


def _produce(url: str, topic: str) -> list[str]:
    """Distinct values, ``RECORDS`` in each of 2 partitions; returns them all."""
    values: list[str] = []
    with Producer(url, linger_ms=2) as producer:
        for partition in (0, 1):
            for _ in range(RECORDS):
                value = str(len(values))
                producer.send(topic, value, key=f"k{value}", partition=partition)
                values.append(value)
        producer.flush()
    return values


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return f"--- {path}:\n" + "\n".join(text.splitlines()[-lines:])


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_stream_sink_survives_speculation_and_a_killed_executor_exactly_once(
    cluster: Cluster, spark_cluster: StandaloneCluster, tmp_path: Path, children: Children
) -> None:
    source = cluster.create_topic(partitions=2, prefix="in")
    sink = cluster.create_topic(partitions=2, prefix="out")
    values = _produce(cluster.url, source)
    marks, events, driver_log = tmp_path / "marks", tmp_path / "events", tmp_path / "driver.log"
    marks.mkdir()
    events.mkdir()
    conf = {
        **spark_cluster.driver_conf(),
        **SPECULATION,
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
        f"spark.executorEnv.{MARKS_ENV}": str(marks),
        f"spark.executorEnv.{SLOW_ENV}": SLOW,
        f"spark.executorEnv.{STALL_ENV}": f"{STALL_BATCH}:{STALL_TASK}:{STALL_AFTER}",
    }
    argv = [
        sys.executable, "-m", "tests.spark.datasource_standalone_job",
        "--master", spark_cluster.master_url, "--bootstrap", cluster.url,
        "--source", source, "--sink", sink, "--prefix", uid("standalone-ds"),
        "--checkpoint", str(tmp_path / "checkpoint"), "--max-records", str(PER_TRIGGER),
        "--write-batch", str(WRITE_BATCH),
        *(arg for name, value in conf.items() for arg in ("--conf", f"{name}={value}")),
    ]  # fmt: skip

    def diagnosis() -> str:
        found = sorted(p.name for p in marks.iterdir())
        logs = "\n".join(_tail(p, 15) for p in spark_cluster.logs())
        return f"marks: {found}\n{_tail(driver_log)}\n{logs}"

    began = time.monotonic()
    # in a session of its own: ``children`` stops its JVM and Python workers with it
    driver = children.start(
        argv, log=driver_log, env=spark_cluster.driver_env(), start_new_session=True
    )
    wait_until(
        lambda: driver.poll() is not None or any(marks.glob(f"{STALLED}*")),
        timeout=240, what="a sink task to stall inside its micro-batch's transaction",
    )  # fmt: skip
    assert driver.poll() is None, f"the driver ended first\n{diagnosis()}"
    (stalled,) = marks.glob(f"{STALLED}*")
    killed = spark_cluster.executor_of(int(stalled.name.removeprefix(STALLED)))
    assert killed.host in spark_cluster.hosts, killed
    os.kill(killed.pid, signal.SIGKILL)
    (marks / KILLED).touch()  # a copy of the stalled task may write now
    assert driver.wait(timeout=240) == 0, f"the driver failed\n{diagnosis()}"
    print(f"job: {time.monotonic() - began:.1f}s; killed {killed}")
    print("marks:", sorted(p.name for p in marks.iterdir()))

    # The stalled attempt had records acknowledged in the open transaction when it died.
    at_stall = json.loads(stalled.read_text())
    print("at the stall:", at_stall)
    assert at_stall["records"] >= STALL_AFTER, at_stall
    assert any(hw > lso for hw, lso in at_stall["offsets"].values()), at_stall

    report = check_topics(cluster.url, [sink], values, untag)
    assert report.ok, report
    uncommitted = Counter(
        untag(r) for r in read_all(cluster.url, sink, isolation_level="read_uncommitted")
    )
    assert uncommitted == Counter(values), "the re-sent batches were not dropped as duplicates"

    log = EventLog.read(events)
    started = log.started()
    speculative = log.speculative()
    print("speculative attempts:", speculative)
    assert speculative, f"Spark started no speculative attempt\n{diagnosis()}"
    for copy in speculative:
        (first,) = (
            t for t in started if (t.stage, t.index, t.attempt) == (copy.stage, copy.index, 0)
        )
        assert copy.host != first.host, (first, copy)  # why the workers need two addresses
    removed = log.removed_executors()
    print("executors removed:", removed)
    assert killed.executor_id in removed, removed
    lost = log.lost_with(killed.executor_id)
    print("attempts lost with the killed executor:", lost)
    assert lost, "no task ended with ExecutorLostFailure on the killed executor"
    for task in lost:
        same_task = [t for t in log.ended() if (t.stage, t.index) == (task.stage, task.index)]
        again = [t for t in same_task if t.reason == "Success"]
        assert again and all(t.executor != killed.executor_id for t in again), (task, again)
