"""Tasks of one transaction writing one partition in slots, through the tasks' wire client
(``SequencedPartitionWriter``) against the real cluster (no Spark needed): three storage
nodes verifying transactional batches with the coordinator, the topic on three replicas.

This is what a streaming sink does with one micro-batch: the driver owns the transaction,
every task writes under the driver's producer id and epoch in a slot of its own, numbered
from 0, and a retried or speculative attempt resends its batches as duplicates."""

from __future__ import annotations

import httpx
import pytest

from sdk import TopicPartition
from spark_jobs._wire import SequencedPartitionWriter, TransactionSession
from spark_jobs.check import read_all
from tests.spark.helpers import uid
from tests.support.cluster import Cluster

pytestmark = pytest.mark.xdist_group("spark")  # shares the Spark modules' cluster


def _batch(task: int, seq: int) -> list[dict[str, str]]:
    return [{"key": f"k{task}", "value": f"t{task}-{seq}"}]


def test_tasks_share_one_producer_in_slots_of_one_partition(cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="slots")
    tp = TopicPartition(topic, 0)
    session = TransactionSession(cluster.url, uid("driver"))
    identity = session.init()
    session.add_partitions([tp])
    tasks = {slot: SequencedPartitionWriter(cluster.url, identity) for slot in (1, 2)}
    speculative = SequencedPartitionWriter(cluster.url, identity)
    try:
        for seq in range(3):  # interleaved: both tasks number their batches from 0
            for slot, writer in tasks.items():
                assert not writer.produce(tp, seq, _batch(slot, seq), slot=slot).duplicate
        assert speculative.last_sequence(tp, slot=2) == 2
        assert speculative.last_sequence(tp, slot=7) == -1
        assert speculative.last_sequence(tp) == -1  # nobody wrote without a slot
        for seq in range(3):  # a second attempt of task 2 resends what it wrote
            assert speculative.produce(tp, seq, _batch(2, seq), slot=2).duplicate
        assert read_all(cluster.url, topic) == []
        session.commit()
        values = sorted(str(r.value) for r in read_all(cluster.url, topic))
        assert values == sorted(f"t{t}-{s}" for t in (1, 2) for s in range(3))

        # every replica rebuilt the slots from the frames it copied
        for node in cluster.nodes:
            with httpx.Client(base_url=node.url, timeout=30, verify=cluster.verify) as http:
                answer = http.get(f"/v1/partitions/{topic}/0/producers", params={"slot": 1})
            assert answer.status_code == 200, answer.text
            [entry] = [
                p for p in answer.json()["producers"] if p["producer_id"] == identity.producer_id
            ]
            assert (entry["slot"], entry["last_sequence"]) == (1, 2)
    finally:
        for wire in (*tasks.values(), speculative, session):
            wire.close()
