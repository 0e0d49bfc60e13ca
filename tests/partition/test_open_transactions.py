"""What a storage node tells the hanging-transaction detector: the open transactions of
the partitions it leads, with their age, and how it takes the abort marker of KIP-664.

The producer state's start time is tested on its own (no I/O); the endpoint on a real
node process (run alone, so it verifies no transactional batch), restarted once to show
the age survives recovery.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from partition_service.log.batch import NO_SEQUENCE
from partition_service.log.producer_state import ProducerStateManager
from tests.support.nodes import NodeProcess

TOPIC = "pinned"


@pytest.mark.unit
def test_the_open_transaction_keeps_the_time_of_its_first_batch() -> None:
    state = ProducerStateManager()
    state.apply_data(7, 0, 0, 10, 11, 1_000, transactional=True)
    state.apply_data(7, 0, 2, 12, 12, 5_000, transactional=True)
    assert state.producers[7].current_txn_start_ms == 1_000
    restored = ProducerStateManager.from_json(state.to_json())
    assert restored.producers[7].current_txn_start_ms == 1_000
    state.apply_marker(7, 1, 0, 6_000)
    assert state.producers[7].current_txn_start_ms is None
    state.apply_data(7, 1, NO_SEQUENCE, 14, 14, 7_000, transactional=True)
    assert state.producers[7].current_txn_start_ms == 7_000


@pytest.mark.unit
def test_a_snapshot_from_before_the_start_time_falls_back_to_the_last_append() -> None:
    state = ProducerStateManager()
    state.apply_data(7, 0, 0, 10, 11, 1_000, transactional=True)
    state.apply_data(7, 0, 2, 12, 12, 5_000, transactional=True)
    old = [{k: v for k, v in raw.items() if k != "txn_start_ms"} for raw in state.to_json()]
    assert ProducerStateManager.from_json(old).producers[7].current_txn_start_ms == 5_000


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path / "data")
    process.start()
    process.create_partition(TOPIC, 0)
    process.create_partition(TOPIC, 1)
    yield process
    process.stop()


def produce(node: NodeProcess, pid: int, epoch: int, seq: int) -> httpx.Response:
    body = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq,
            "transactional": True, "records": [{"value": f"v{seq}"}]}  # fmt: skip
    with node.client() as client:
        return client.post(f"/v1/partitions/{TOPIC}/0/records", json=body)


def open_transactions(node: NodeProcess) -> list[dict[str, Any]]:
    with node.internal() as internal:
        answer = internal.get("/internal/v1/open-transactions")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["node_id"] == 1 and body["now_ms"] > 0
    return list(body["open_transactions"])


@pytest.mark.slow
def test_node_reports_open_transactions_and_takes_the_bumped_abort(node: NodeProcess) -> None:
    assert produce(node, 42, 3, 0).status_code == 200
    assert produce(node, 42, 3, 1).status_code == 200
    [found] = open_transactions(node)
    assert {k: v for k, v in found.items() if k != "age_ms"} == {
        "topic": TOPIC, "partition": 0, "producer_id": 42, "producer_epoch": 3,
        "coordinator_epoch": -1, "first_offset": 0,
    }  # fmt: skip
    with node.client() as client:
        assert client.get("/internal/v1/open-transactions").status_code == 401
        [described] = client.get(f"/v1/partitions/{TOPIC}/0/producers").json()["producers"]
    assert described["current_txn_start_offset"] == 0 and described["current_txn_start_ms"] > 0

    node.stop()
    node.start()
    [again] = open_transactions(node)
    assert again["first_offset"] == 0 and again["age_ms"] >= found["age_ms"]

    marker = {"markers": [{"producer_id": 42, "producer_epoch": 4, "coordinator_epoch": 0,
                           "result": "ABORT", "partitions": [{"topic": TOPIC, "partition": 0}]}]}
    with node.internal() as internal:
        written = internal.post("/internal/v1/markers", json=marker)
    assert written.json()["results"][0]["error"] is None
    assert open_transactions(node) == []
    with node.client() as client:
        [described] = client.get(f"/v1/partitions/{TOPIC}/0/producers").json()["producers"]
    assert described["current_txn_start_ms"] is None and described["producer_epoch"] == 4
    late = produce(node, 42, 3, 2)
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED"
    with node.client() as client:
        offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
        fetched = client.get(f"/v1/partitions/{TOPIC}/0/records",
                             params={"isolation_level": "read_committed"}).json()
    assert offsets["last_stable_offset"] == offsets["high_watermark"] == 3
    assert fetched["records"] == []
    assert produce(node, 42, 4, 0).status_code == 200  # the new epoch starts at sequence 0
