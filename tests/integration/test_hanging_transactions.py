"""The hanging-transaction detector against real processes (KIP-664, issue 19).

How a hanging transaction is planted: a transactional batch is written straight to a
storage node's produce endpoint with a producer id and epoch no coordinator ever issued.
A node verifies a batch that opens a transaction with the coordinators (KIP-890) and would
refuse it, so the nodes here run with ``--txn-verification off`` (the setting for a node
run without coordinators): the batch is appended as it comes, exactly as a node that lost
its verification, or a producer that skipped add-partitions, would have it. The
coordinators run as usual on a PostgreSQL database migrated by Alembic; the producers of
the tests speak transaction version 1 (they add their partitions themselves, which a node
without verification would otherwise never do for them).

A lost COMMIT marker is planted the other way round: a transaction is written through the
coordinator and the node, then the coordinator is stopped and its record set to
CompleteCommit, as when a node's answer was counted as written but the marker never
reached the partition's log; the coordinator starts again and loads that record.

Nothing here sleeps to wait: every wait polls with a deadline (``wait_until``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from sdk import Consumer, TransactionalProducer
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

PLANTED_PID = 987_654_321  # far above any block the coordinator hands out here
SCAN = ("--hanging-scan-interval-ms", "200")
UNVERIFIED = ("--txn-verification", "off")
# long enough for a loaded machine to look at the pinned LSO and the report first
AUTO_AFTER_MS = 8_000
SET_ASIDE = 'eos_coordinator_background_entries_set_aside_total{loop="hanging"}'


@pytest.fixture(scope="module")
def reporting(module_cluster_factory: ClusterFactory) -> Cluster:
    """Detector on, report only (no ``--abort-hanging-after-ms``)."""
    return module_cluster_factory(
        database="postgres", nodes=1, node_flags=UNVERIFIED, coordinator_flags=SCAN
    )


# --- helpers ---------------------------------------------------------------------------


def plant(
    cluster: Cluster, topic: str, *, pid: int = PLANTED_PID, epoch: int = 3, node: int = 1
) -> int:
    """A transactional batch of an id and epoch nobody issued; its first offset."""
    answer = produce_raw(cluster, topic, pid, epoch, 0, ["planted-1", "planted-2"], node=node)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["base_offset"])


def produce_raw(
    cluster: Cluster, topic: str, pid: int, epoch: int, seq: int, values: list[str],
    node: int = 1,
) -> httpx.Response:
    body = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq,
            "transactional": True, "records": [{"value": v} for v in values]}  # fmt: skip
    return httpx.post(f"{cluster.node(node).url}/v1/partitions/{topic}/0/records", json=body,
                      timeout=30)  # fmt: skip


def offsets(cluster: Cluster, topic: str, node: int = 1) -> dict[str, int]:
    answer = httpx.get(f"{cluster.node(node).url}/v1/partitions/{topic}/0/offsets", timeout=30)
    return answer.json()  # type: ignore[no-any-return]


def leader_of(cluster: Cluster, topic: str) -> int:
    answer = httpx.get(f"{cluster.url}/v1/topics/{topic}", timeout=30).json()
    return int(answer["partitions"][0]["leader"]["node_id"])


def commit(cluster: Cluster, topic: str, tid: str, values: list[str]) -> None:
    with TransactionalProducer(cluster.bootstrap(), tid, transaction_version=1) as producer:
        producer.init_transactions()
        with producer.transaction():
            for value in values:
                producer.send(topic, value, partition=0)


def read_committed(cluster: Cluster, topic: str, until: int) -> list[str]:
    """Every value read_committed returns below offset ``until`` (the high watermark)."""
    values: list[str] = []
    with Consumer(cluster.bootstrap(), isolation_level="read_committed") as consumer:
        consumer.assign([(topic, 0)])
        for _ in range(20):
            if consumer.position((topic, 0)) >= until:
                break
            values += [str(r.value) for r in consumer.poll(timeout=0.5)]
    return values


def hanging(cluster: Cluster) -> dict[str, Any]:
    answer = httpx.get(f"{cluster.url}/v1/admin/hanging-transactions", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def entry_of(cluster: Cluster, topic: str, pid: int) -> dict[str, Any] | None:
    return next((h for h in hanging(cluster)["hanging"]
                 if h["topic"] == topic and h["producer_id"] == pid), None)  # fmt: skip


def metric(cluster: Cluster, name: str) -> float:
    text = httpx.get(f"{cluster.url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def abort(cluster: Cluster, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/admin/hanging-transactions/abort", json=body,
                      timeout=30)  # fmt: skip


def eos(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EOS_BOOTSTRAP": cluster.bootstrap(), "COLUMNS": "240"}
    return subprocess.run([sys.executable, "-m", "eos_cli.entry", *args], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def engine(reporting: Cluster) -> Iterator[sa.Engine]:
    assert reporting.database_url is not None
    made = sa.create_engine(reporting.database_url)
    yield made
    made.dispose()


# --- the planted hanging transaction ---------------------------------------------------


def test_planted_transaction_is_aborted_without_a_person(
    cluster_factory: ClusterFactory,
) -> None:
    """The LSO is pinned by the planted batch, the detector reports it, and with
    ``--abort-hanging-after-ms`` it aborts it: the LSO moves again, read_committed shows
    the records committed after it and never the planted ones, and the planted producer's
    old epoch is fenced on the partition."""
    cluster = cluster_factory(
        database="postgres", nodes=1, node_flags=UNVERIFIED,
        coordinator_flags=(*SCAN, "--abort-hanging-after-ms", str(AUTO_AFTER_MS)),
    )  # fmt: skip
    topic = cluster.create_topic(partitions=1)
    commit(cluster, topic, "before", ["before"])
    planted = plant(cluster, topic)
    commit(cluster, topic, "after", ["after-1", "after-2"])

    pinned = offsets(cluster, topic)
    assert pinned["last_stable_offset"] == planted < pinned["high_watermark"]
    assert read_committed(cluster, topic, planted) == ["before"]  # nothing past it
    found = entry_of(cluster, topic, PLANTED_PID)
    assert found is not None and found["reason"] == "unknown_producer"
    assert found["first_offset"] == planted and found["producer_epoch"] == 3
    assert found["transactional_id"] is None and found["coordinator_state"] is None
    wait_until(lambda: metric(cluster, "eos_hanging_transactions") >= 1, what="the gauge")

    def released() -> bool:
        now = offsets(cluster, topic)
        return now["last_stable_offset"] == now["high_watermark"]

    wait_until(released, timeout=30, what="the LSO to move past the planted batch")
    end = offsets(cluster, topic)["high_watermark"]
    assert read_committed(cluster, topic, end) == ["before", "after-1", "after-2"]
    assert entry_of(cluster, topic, PLANTED_PID) is None
    assert metric(cluster, 'eos_hanging_transactions_resolved_total{action="abort"}') >= 1
    wait_until(lambda: metric(cluster, "eos_hanging_transactions") == 0, what="gauge at 0")

    late = produce_raw(cluster, topic, PLANTED_PID, 3, 2, ["zombie"])
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED"


def test_replicated_partition_is_reported_once_and_its_abort_replicates(
    cluster_factory: ClusterFactory,
) -> None:
    """On a partition with two replicas only the leader reports the planted transaction;
    the abort marker is written there and replicated, so the follower, once it leads,
    has the transaction ended too (its LSO is its high watermark and read_committed skips
    the planted records)."""
    cluster = cluster_factory(
        database="postgres", nodes=2, replication_factor=2, node_flags=UNVERIFIED,
        coordinator_flags=(*SCAN, "--abort-hanging-after-ms", str(AUTO_AFTER_MS)),
    )  # fmt: skip
    topic = cluster.create_topic(partitions=1)
    leader = leader_of(cluster, topic)
    follower = 3 - leader
    planted = plant(cluster, topic, node=leader)
    commit(cluster, topic, "replicated", ["after"])
    entries = [h for h in hanging(cluster)["hanging"] if h["topic"] == topic]
    assert [(h["producer_id"], h["first_offset"]) for h in entries] == [(PLANTED_PID, planted)]

    def released(node: int) -> bool:
        now = offsets(cluster, topic, node)
        return now["last_stable_offset"] == now["high_watermark"] > planted

    wait_until(lambda: released(leader), timeout=30, what="the abort on the leader")

    def ended_on_follower() -> bool:
        url = f"{cluster.node(follower).url}/v1/partitions/{topic}/0/producers"
        producers = httpx.get(url, timeout=30).json()["producers"]
        ours = [p for p in producers if p["producer_id"] == PLANTED_PID]
        return [(p["producer_epoch"], p["current_txn_start_offset"]) for p in ours] == [(4, None)]

    wait_until(ended_on_follower, timeout=30, what="the replicated marker on the follower")
    cluster.node(leader).kill()
    wait_until(lambda: leader_of(cluster, topic) == follower, timeout=30,
               what="the follower to lead")  # fmt: skip
    wait_until(lambda: released(follower), timeout=30, what="the new leader's LSO")
    end = offsets(cluster, topic, follower)["high_watermark"]
    assert read_committed(cluster, topic, end) == ["after"]
    assert metric(cluster, 'eos_hanging_transactions_resolved_total{action="abort"}') == 1


def test_reported_by_api_metric_and_cli_then_aborted_by_the_cli(reporting: Cluster) -> None:
    """Report only: the planted transaction is listed and counted, pass after pass, and
    the LSO stays where it is until an operator aborts it."""
    topic = reporting.create_topic(partitions=1)
    planted = plant(reporting, topic, pid=PLANTED_PID + 1)
    wait_until(lambda: metric(reporting, "eos_hanging_transactions") >= 1, what="the gauge")
    set_aside = metric(reporting, SET_ASIDE)

    table = eos(reporting, "transactions", "hanging")
    assert table.returncode == 0, table.stderr
    assert str(PLANTED_PID + 1) in table.stdout and "unknown_producer" in table.stdout
    listed = eos(reporting, "transactions", "hanging", "--json")
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert set(shown) == {"checked_at_ms", "open_on_nodes", "hanging"}
    ours = [h for h in shown["hanging"] if h["topic"] == topic]
    assert len(ours) == 1 and ours[0]["first_offset"] == planted
    assert set(ours[0]) == {"topic", "partition", "producer_id", "producer_epoch",
                            "first_offset", "age_ms", "reason", "transactional_id",
                            "coordinator_state"}  # fmt: skip
    assert offsets(reporting, topic)["last_stable_offset"] == planted  # reported, not acted on
    assert set_aside == metric(reporting, SET_ASIDE)  # no pass failed on any entry

    aborted = eos(reporting, "transactions", "abort-hanging", "--topic", topic, "--partition",
                  "0", "--producer-id", str(PLANTED_PID + 1), "--producer-epoch", "3")
    assert aborted.returncode == 0, aborted.stderr
    assert "marker epoch 4" in aborted.stdout
    now = offsets(reporting, topic)
    assert now["last_stable_offset"] == now["high_watermark"]


def test_abort_endpoint_answers_and_refusals(reporting: Cluster) -> None:
    """Bad input and refusals change nothing; the abort answers what it wrote; a
    transaction the coordinator holds as ongoing is neither hanging nor aborted here."""
    topic = reporting.create_topic(partitions=1)
    pid = PLANTED_PID + 2
    planted = plant(reporting, topic, pid=pid, epoch=7)
    good = {"topic": topic, "partition": 0, "producer_id": pid, "producer_epoch": 7}
    refusals = [
        ({**good, "topic": "no-such-topic"}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        ({**good, "partition": 5}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        ({**good, "producer_epoch": 6}, 404, "NOT_FOUND"),
        ({**good, "producer_id": pid + 1}, 404, "NOT_FOUND"),
        ({**good, "partition": -1}, 422, "INVALID_REQUEST"),
        ({**good, "topic": ".."}, 422, "INVALID_REQUEST"),
        ({**good, "extra": 1}, 422, "INVALID_REQUEST"),
        ({"topic": topic, "partition": 0}, 422, "INVALID_REQUEST"),
    ]
    for body, status, code in refusals:
        answer = abort(reporting, body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), body
    wrong = eos(reporting, "transactions", "abort-hanging", "--topic", topic, "--partition",
                "0", "--producer-id", str(pid), "--producer-epoch", "6")
    assert wrong.returncode == 1 and "NOT_FOUND" in wrong.stderr, wrong.stderr
    assert offsets(reporting, topic)["last_stable_offset"] == planted
    assert entry_of(reporting, topic, pid) is not None

    # an Ongoing transaction of a real producer: known, so not hanging, and not aborted here
    with TransactionalProducer(reporting.bootstrap(), "ongoing", transaction_version=1) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, "in-flight", partition=0)
        p.flush()
        ongoing = [h for h in hanging(reporting)["hanging"] if h["topic"] == topic]
        assert [h["producer_id"] for h in ongoing] == [pid]
        producers = httpx.get(f"{reporting.node(1).url}/v1/partitions/{topic}/0/producers",
                              timeout=30).json()["producers"]  # fmt: skip
        real = next(x for x in producers if x["producer_id"] != pid)
        held = abort(reporting, {**good, "producer_id": real["producer_id"],
                                 "producer_epoch": real["producer_epoch"]})  # fmt: skip
        assert held.status_code == 409 and held.json()["error"]["code"] == "INVALID_TXN_STATE"
        p.abort_transaction()

    done = abort(reporting, good)
    assert done.status_code == 200, done.text
    assert done.json() == {"topic": topic, "partition": 0, "producer_id": pid,
                           "producer_epoch": 7, "marker_epoch": 8, "first_offset": planted,
                           "leader": 1}  # fmt: skip
    again = abort(reporting, good)
    assert again.status_code == 404 and again.json()["error"]["code"] == "NOT_FOUND"
    now = offsets(reporting, topic)
    assert now["last_stable_offset"] == now["high_watermark"]
    assert entry_of(reporting, topic, pid) is None


# --- the lost COMMIT marker ------------------------------------------------------------


def test_lost_commit_marker_is_committed_never_aborted(
    reporting: Cluster, engine: sa.Engine
) -> None:
    """Committed batches whose marker was lost: reported with the coordinator's
    CompleteCommit, an operator's abort is refused (nothing changes), and once the
    coordinator runs with ``abort_hanging_after_ms`` the COMMIT marker is sent again and
    read_committed shows every record."""
    topic = reporting.create_topic(partitions=1)
    url = reporting.url
    ids = httpx.post(f"{url}/v1/transactions/lost/init", json={}, timeout=30).json()
    ident = {"producer_id": ids["producer_id"], "producer_epoch": ids["producer_epoch"]}
    added = httpx.post(f"{url}/v1/transactions/lost/partitions", timeout=30,
                       json={**ident, "partitions": [{"topic": topic, "partition": 0}]})
    assert added.status_code == 200, added.text
    first = produce_raw(reporting, topic, ident["producer_id"], ident["producer_epoch"], 0,
                        ["kept-1", "kept-2"])  # fmt: skip
    assert first.status_code == 200, first.text
    offset = int(first.json()["base_offset"])

    coordinator = reporting.coordinator
    coordinator.stop()
    with engine.begin() as conn:
        changed = conn.execute(
            sa.text("UPDATE transactions SET state = 'CompleteCommit' "
                    "WHERE transactional_id = 'lost' AND state = 'Ongoing'")
        )  # fmt: skip
        assert changed.rowcount == 1
    reporting.start_coordinator(0)

    def reported() -> dict[str, Any] | None:
        return entry_of(reporting, topic, ident["producer_id"])

    wait_until(lambda: reported() is not None, what="the lost commit to be reported")
    found = reported()
    assert found is not None
    assert found["reason"] == "not_ongoing_at_coordinator"
    assert (found["transactional_id"], found["coordinator_state"]) == ("lost", "CompleteCommit")
    refused = abort(reporting, {"topic": topic, "partition": 0, **ident})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "INVALID_TXN_STATE"
    assert offsets(reporting, topic)["last_stable_offset"] == offset

    coordinator.stop()
    coordinator.launch(env={**coordinator.env, "EOS_ABORT_HANGING_AFTER_MS": "0"})
    coordinator.wait_ready(60)

    def released() -> bool:
        now = offsets(reporting, topic)
        return now["last_stable_offset"] == now["high_watermark"]

    wait_until(released, timeout=30, what="the COMMIT marker to be sent again")
    end = offsets(reporting, topic)["high_watermark"]
    assert read_committed(reporting, topic, end) == ["kept-1", "kept-2"]
    assert metric(reporting, 'eos_hanging_transactions_resolved_total{action="commit"}') == 1
    assert metric(reporting, 'eos_hanging_transactions_resolved_total{action="abort"}') == 0

    coordinator.stop()  # the other tests of the module run report-only
    reporting.start_coordinator(0)
