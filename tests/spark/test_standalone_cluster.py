"""The exactly-once pipeline on a Spark standalone cluster of real processes, run by the
real ``eos spark run --master spark://...``, with speculation on and an executor killed
with SIGKILL in the middle of a transaction.

Local mode can show neither fault (one host, executors inside the driver's JVM), so the
cluster (``tests.support.spark_standalone``) has two workers on two loopback addresses,
which Spark takes for two hosts, one executor of one core each. The source has 40 records
in partition 0 and 80 in partition 1, copied 40 per partition per batch by
``tests.spark.cluster_faults``:

* batch 1, two tasks: the first attempt of partition 0's stops half way until another
  attempt passes it. Once partition 1's task has finished, Spark starts a speculative copy
  on the other host; its ``init_transactions`` fences the first attempt, which then fails
  or is killed by Spark;
* batch 2, one task (partition 1's; a lone task is never speculated): its first attempt
  waits until its open transaction's records are on the node (the tasks write batches of
  ``WRITE_BATCH`` records, so the ones before the stall are there) and says so in a file; the
  test SIGKILLs that task's executor JVM, and Spark runs the task again on another
  executor, whose init aborts the dead attempt's transaction.

Both faults are proven from Spark's own event log, not assumed (and the unit tests below
show the log's reader finds nothing in a log without them). The output, read
read_committed, holds every input exactly once, and the group's offsets are at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk import Producer
from spark_jobs.check import check_topics, offsets_at_end, read_all
from tests.spark.cluster_faults import STALLED
from tests.spark.helpers import uid, untag
from tests.support.children import Children
from tests.support.cluster import Cluster
from tests.support.processes import wait_until
from tests.support.spark_event_log import EventLog
from tests.support.spark_standalone import StandaloneCluster

pytestmark = pytest.mark.xdist_group("spark")  # one Spark application at a time

RECORDS = {0: 40, 1: 80}  # per source partition
BATCH = 40
WRITE_BATCH = 10  # records per produce request of a task (the default is 10,000)
SLOW = "0:20"  # batch 1: the first attempt of partition 0's task waits for its copy here
STALL = "1:60"  # batch 2: the first attempt of partition 1's task hangs here
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
    """Distinct values, ``RECORDS[p]`` of them in partition ``p``; returns them all."""
    values: list[str] = []
    with Producer(url, linger_ms=2) as producer:
        for partition, count in RECORDS.items():
            for _ in range(count):
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
def test_speculation_and_a_killed_executor_leave_every_input_exactly_once(
    cluster: Cluster, spark_cluster: StandaloneCluster, tmp_path: Path, children: Children
) -> None:
    source = cluster.create_topic(partitions=2, prefix="in")
    sink = cluster.create_topic(partitions=2, prefix="out")
    values = _produce(cluster.url, source)
    marks, events, driver_log = tmp_path / "marks", tmp_path / "events", tmp_path / "driver.log"
    marks.mkdir()
    events.mkdir()
    app = uid("standalone")
    conf = {
        **spark_cluster.driver_conf(),
        **SPECULATION,
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
    }
    argv = [
        str(Path(sys.executable).with_name("eos")), "spark", "run",
        "--bootstrap", cluster.url, "--master", spark_cluster.master_url,
        "--app", app, "--source", source, "--max-batch-records", str(BATCH),
        "--write-batch-records", str(WRITE_BATCH),
        "--transform", "tests.spark.cluster_faults:tag_with_faults",
        "-o", f"topic={sink}", "-o", f"bootstrap={cluster.url}", "-o", f"marks={marks}",
        "-o", f"slow={SLOW}", "-o", f"stall={STALL}",
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
        timeout=150, what="a task to stall inside its transaction",
    )  # fmt: skip
    assert driver.poll() is None, f"the driver ended first\n{diagnosis()}"
    (stalled,) = marks.glob(f"{STALLED}*")
    killed = spark_cluster.executor_of(int(stalled.name.removeprefix(STALLED)))
    assert killed.host in spark_cluster.hosts, killed
    os.kill(killed.pid, signal.SIGKILL)
    assert driver.wait(timeout=150) == 0, f"the driver failed\n{diagnosis()}"
    print(f"job: {time.monotonic() - began:.1f}s; killed {killed}")
    print("marks:", sorted(p.name for p in marks.iterdir()))

    report = check_topics(cluster.url, [sink], values, untag)
    assert report.ok, report
    offsets = offsets_at_end(cluster.url, source, app)
    assert all(committed == end for committed, end in offsets.values()), offsets
    written = read_all(cluster.url, sink, isolation_level="read_uncommitted")
    assert len(written) > len(values), "the dead attempts' records reached the node (aborted)"

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


# The event log's reader, on logs written here: it must find nothing where nothing happened.

_INFO = {"Task ID": 0, "Index": 0, "Attempt": 0, "Partition ID": 0, "Launch Time": 1,
         "Executor ID": "0", "Host": "127.0.0.2", "Locality": "PROCESS_LOCAL",
         "Speculative": False, "Finish Time": 0, "Failed": False, "Killed": False}  # fmt: skip


def _start(**info: object) -> dict[str, object]:
    return {"Event": "SparkListenerTaskStart", "Stage ID": 0, "Stage Attempt ID": 0,
            "Task Info": {**_INFO, **info}}  # fmt: skip


def _end(reason: dict[str, object], **info: object) -> dict[str, object]:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": 0, "Stage Attempt ID": 0,
            "Task Type": "ResultTask", "Task End Reason": reason,
            "Task Info": {**_INFO, **info}}  # fmt: skip


def _write_rolling_log(directory: Path, *events: dict[str, object]) -> Path:
    log = directory / "eventlog_v2_app-1"
    log.mkdir(parents=True)
    half = len(events) // 2
    for n, part in enumerate((events[:half], events[half:]), 1):
        (log / f"events_{n}_app-1").write_text("".join(json.dumps(e) + "\n" for e in part))
    return directory


@pytest.mark.unit
def test_the_event_log_reader_finds_no_fault_in_a_quiet_run(tmp_path: Path) -> None:
    quiet = _write_rolling_log(
        tmp_path,
        {"Event": "SparkListenerExecutorAdded", "Executor ID": "0"},
        _start(),
        _start(**{"Task ID": 1, "Index": 1, "Executor ID": "1", "Host": "127.0.0.3"}),
        _end({"Reason": "Success"}),
        _end({"Reason": "Success"}, **{"Task ID": 1, "Index": 1, "Executor ID": "1"}),
    )
    log = EventLog.read(quiet)
    assert len(log.started()) == 2 and len(log.ended()) == 2
    assert log.speculative() == []
    assert log.removed_executors() == {}
    assert log.lost_with("0") == [] and log.lost_with("1") == []


@pytest.mark.unit
def test_the_event_log_reader_finds_a_speculative_copy_and_a_lost_executor(
    tmp_path: Path,
) -> None:
    lost = {"Reason": "ExecutorLostFailure", "Executor ID": "0", "Exit Caused By App": True}
    copy = {"Task ID": 1, "Attempt": 1, "Executor ID": "1", "Host": "127.0.0.3"}
    busy = _write_rolling_log(
        tmp_path,
        _start(),
        _start(**copy, Speculative=True),
        {
            "Event": "SparkListenerExecutorRemoved",
            "Executor ID": "0",
            "Removed Reason": "Command exited with code 137",
        },
        _end(lost),
        _end({"Reason": "Success"}, **copy, Speculative=True),
    )
    log = EventLog.read(busy)
    (speculative,) = log.speculative()
    assert (speculative.attempt, speculative.host) == (1, "127.0.0.3")
    assert log.removed_executors() == {"0": "Command exited with code 137"}
    assert [t.reason for t in log.lost_with("0")] == ["ExecutorLostFailure"]
    assert log.lost_with("1") == []
