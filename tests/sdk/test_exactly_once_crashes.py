"""End to end: a consume-transform-produce loop killed with SIGKILL at random points and
restarted several times still turns every input record into exactly one output record."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sdk import AdminClient, Consumer, Producer, TopicPartition
from tests.sdk.helpers import read_topic, uid, wait_for
from tests.support.children import Children
from tests.support.cluster import Cluster

INPUT_RECORDS = 600


def _worker(
    children: Children, cluster: Cluster, args: list[str], log: Path
) -> subprocess.Popen[bytes]:
    return children.start(
        [sys.executable, "-m", "tests.sdk.ctp_worker", "--url", cluster.url, *args], log=log
    )


@pytest.mark.slow
def test_output_equals_input_exactly_once_across_sigkills(
    cluster: Cluster, tmp_path: Path, children: Children
) -> None:
    source = cluster.create_topic(partitions=2, prefix="in")
    sink = cluster.create_topic(partitions=2, prefix="out")
    group, tid = uid("ctp"), uid("ctp-tx")
    with Producer(cluster.url) as producer:
        for i in range(INPUT_RECORDS):
            producer.send(source, str(i), key=str(i))
        producer.flush()

    # 50 ms between transactions: at most a few of the 40 fit between the progress seen
    # and the kill, so the input outlasts the four workers and each one has work to do
    args = ["--input", source, "--output", sink, "--group", group, "--tid", tid,
            "--partitions", "2", "--pause-ms", "50"]
    rng = random.Random(2024)
    log = tmp_path / "worker.log"
    kills = 0
    for _ in range(4):
        worker = _worker(children, cluster, args, log)
        # Let it get going (output grows), then kill it at a random point of its work.
        _wait_for_progress(cluster, sink, worker, log)
        time.sleep(rng.uniform(0.0, 0.3))  # the random point, not a wait for a condition
        if worker.poll() is None:
            kills += 1
        children.kill(worker)
    assert kills >= 3

    final = _worker(children, cluster, [*args, "--exit-when-idle"], log)
    assert final.wait(timeout=90) == 0, log.read_text()[-3000:]

    output = read_topic(cluster.url, sink, 2, expect=INPUT_RECORDS)
    written = read_topic(cluster.url, sink, 2, isolation_level="read_uncommitted")
    print(f"{kills} kills; {len(written) - len(output)} records of aborted transactions hidden")
    counts = Counter(r.value for r in output)
    assert counts == Counter(f"out:{i}" for i in range(INPUT_RECORDS)), (
        f"duplicates: {[v for v, n in counts.items() if n > 1][:5]}, "
        f"missing: {INPUT_RECORDS - len(counts)}"
    )
    with Consumer(cluster.url, group) as consumer:
        tps = [TopicPartition(source, p) for p in range(2)]
        committed = consumer.committed(tps)
    ends = {tp: read_end(cluster, tp) for tp in tps}
    assert {tp: om.offset if om else None for tp, om in committed.items()} == ends


def _wait_for_progress(
    cluster: Cluster, sink: str, worker: subprocess.Popen[bytes], log: Path
) -> None:
    before = _written(cluster, sink)
    try:
        wait_for(lambda: worker.poll() is not None or _written(cluster, sink) > before,
                 timeout=60, what="the worker to write")
    except AssertionError as exc:
        exc.add_note(f"worker log:\n{log.read_text()[-3000:]}")
        exc.add_note(f"coordinator log:\n{cluster.coordinator.tail(30)}")
        raise


def _written(cluster: Cluster, topic: str) -> int:
    with AdminClient(cluster.url) as admin:
        return sum(admin.list_offsets((topic, p)).high_watermark for p in range(2))


def read_end(cluster: Cluster, tp: TopicPartition) -> int:
    with AdminClient(cluster.url) as admin:
        return admin.list_offsets(tp).high_watermark
