"""acks=all with min.insync.replicas 2, on real processes (issue 27).

Three nodes, a topic of three replicas. Both followers of a partition are SIGSTOPped and
an idempotent batch is sent to its leader at once: no follower ever copies it. The leader
drops the stopped followers from the ISR (its lag rule, through the controller) and its
high watermark jumps to its own log end. The batch must not be acknowledged then — one
replica holds it, the minimum is two — but answered ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``,
and a batch sent after the shrink is refused before it is written
(``NOT_ENOUGH_REPLICAS``). Resumed, the followers catch up and rejoin, and the producer's
retry of the same batch is acknowledged as the duplicate it is: one copy in the log (the
retry may first meet ``NOT_ENOUGH_REPLICAS`` for as long as the leader has not yet heard the
controller's answer that widened the ISR, which the controller shows the moment it holds it).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.support.cluster import ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

VALUES = [f"in flight {i}" for i in range(5)]


def test_a_write_in_flight_when_the_isr_shrinks_is_not_acknowledged(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        nodes=3, replication_factor=3, fsync=True,
        # the lag rule shrinks the ISR; the liveness rule is slow, so that node 1 keeps
        # leading on a loaded machine and the stopped followers are never elected
        node_flags=("--replica-lag-time-max-ms", "2000"),
        coordinator_flags=("--node-session-timeout-ms", "30000"),
    )  # fmt: skip
    with httpx.Client(base_url=cluster.url, timeout=30) as client:
        client.post("/v1/topics", json={"name": "acks", "partitions": 1}).raise_for_status()

        def state() -> dict[str, Any]:
            answer: dict[str, Any] = client.get("/v1/topics/acks").json()["partitions"][0]
            return answer

        wait_until(lambda: sorted(state()["isr"]) == [1, 2, 3], timeout=30,
                   what="every replica in sync")  # fmt: skip
        leader_id = int(state()["leader"]["node_id"])
        leader = str(state()["leader"]["url"])
        followers = [n for n in (1, 2, 3) if n != leader_id]
        producer = client.post("/v1/producers", json={}).json()
        pid, epoch = int(producer["producer_id"]), int(producer["producer_epoch"])

    def batch(sequence: int, values: list[str]) -> dict[str, Any]:
        return {"producer_id": pid, "producer_epoch": epoch, "base_sequence": sequence,
                "acks": -1, "records": [{"value": v} for v in values]}  # fmt: skip

    def produce(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{leader}/v1/partitions/acks/0/records", json=body, timeout=60)

    first = produce(batch(0, ["before"]))
    assert first.status_code == 200, first.text

    answers: list[httpx.Response] = []
    for n in followers:
        cluster.node(n).pause()
    try:
        sender = threading.Thread(target=lambda: answers.append(produce(batch(1, VALUES))))
        sender.start()
        sender.join(timeout=90)
        assert not sender.is_alive(), "the leader never answered the batch in flight"
        (answer,) = answers
        with httpx.Client(base_url=cluster.url, timeout=30) as client:
            isr = client.get("/v1/topics/acks").json()["partitions"][0]["isr"]
        assert isr == [leader_id], f"the ISR did not shrink to the leader alone: {isr}"
        # today's bug answered 200 here, as soon as the ISR shrank
        assert answer.status_code == 503, f"acknowledged by the leader alone: {answer.text}"
        assert answer.json()["error"]["code"] == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
        assert answer.json()["error"]["retriable"] is True
        refused = produce(batch(6, ["after the shrink"]))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "NOT_ENOUGH_REPLICAS"
    finally:
        for n in followers:
            cluster.node(n).resume()

    with httpx.Client(base_url=cluster.url, timeout=30) as client:
        wait_until(lambda: sorted(client.get("/v1/topics/acks").json()["partitions"][0]["isr"])
                   == [1, 2, 3], timeout=60, what="the followers back in the ISR")  # fmt: skip
    # the controller holds the wider ISR before the leader has read its answer: until then
    # the leader refuses the retry before writing it (retriable), as a client would be told
    retries: list[httpx.Response] = []

    def retried() -> bool:
        retries.append(produce(batch(1, VALUES)))
        error = retries[-1].json().get("error") if retries[-1].status_code == 503 else None
        return error is None or error["code"] != "NOT_ENOUGH_REPLICAS"

    wait_until(retried, timeout=30, interval=0.2, what="the leader to hear of the wider ISR")
    retry = retries[-1]
    assert retry.status_code == 200, retry.text
    assert retry.json()["duplicate"] is True  # the write that was refused, not a second copy
    read = httpx.get(
        f"{leader}/v1/partitions/acks/0/records",
        params={"offset": 0, "isolation_level": "read_committed"},
        timeout=30,
    )
    assert [r["value"] for r in read.json()["records"]] == ["before", *VALUES]
