"""Producer slots over HTTP, on a real node process: ``slot`` in the produce request, the
``slot`` query parameter of DescribeProducers, and the slots' state after a restart.

The node runs alone, so it verifies no transactional batch; the markers are written
through its internal endpoint as a coordinator would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.nodes import NodeProcess

TOPIC = "slots"
PID, EPOCH = 77, 2


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path / "data")
    process.start()
    process.create_partition(TOPIC, 0)
    yield process
    process.stop()


def produce(
    client: httpx.Client, seq: int, values: list[str], slot: int | None = None, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {
        "producer_id": PID,
        "producer_epoch": EPOCH,
        "base_sequence": seq,
        "transactional": True,
        "records": [{"value": v} for v in values],
        **extra,
    }
    if slot is not None:
        body["slot"] = slot
    return client.post(f"/v1/partitions/{TOPIC}/0/records", json=body)


def appended(response: httpx.Response) -> tuple[int, bool]:
    assert response.status_code == 200, response.text
    body = response.json()
    return int(body["base_offset"]), bool(body["duplicate"])


def described(client: httpx.Client, slot: int | None = None) -> dict[str, Any]:
    params = {} if slot is None else {"slot": slot}
    response = client.get(f"/v1/partitions/{TOPIC}/0/producers", params=params)
    assert response.status_code == 200, response.text
    [entry] = response.json()["producers"]
    return dict(entry)


def commit(node: NodeProcess) -> None:
    marker = {"producer_id": PID, "producer_epoch": EPOCH, "coordinator_epoch": 0,
              "result": "COMMIT", "partitions": [{"topic": TOPIC, "partition": 0}]}  # fmt: skip
    with node.internal() as internal:
        answer = internal.post("/internal/v1/markers", json={"markers": [marker]})
    assert answer.status_code == 200 and answer.json()["results"][0]["error"] is None


def committed(client: httpx.Client) -> list[str]:
    response = client.get(
        f"/v1/partitions/{TOPIC}/0/records", params={"isolation_level": "read_committed"}
    )
    assert response.status_code == 200, response.text
    return [r["value"] for r in response.json()["records"]]


@pytest.mark.slow
def test_slots_over_http_and_across_a_restart(node: NodeProcess) -> None:
    with node.client() as client:
        assert appended(produce(client, 0, ["a0", "a1"], slot=1)) == (0, False)
        assert appended(produce(client, 0, ["b0"], slot=2)) == (2, False)
        assert appended(produce(client, 0, ["c0"])) == (3, False)  # no slot: slot 0
        assert appended(produce(client, 0, ["a0", "a1"], slot=1)) == (0, True)
        gap = produce(client, 5, ["b5"], slot=2)
        assert gap.status_code == 409
        assert gap.json()["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"

        assert described(client)["last_sequence"] == 0
        assert described(client)["slot"] == 0
        assert {k: described(client, 1)[k] for k in ("last_sequence", "slot")} == {
            "last_sequence": 1, "slot": 1,
        }  # fmt: skip
        assert described(client, 9)["last_sequence"] == -1
        assert described(client, 2)["current_txn_start_offset"] == 0
        assert committed(client) == []

    node.stop()
    node.start()
    with node.client() as client:
        assert described(client, 1)["last_sequence"] == 1
        assert described(client, 2)["last_sequence"] == 0
        assert appended(produce(client, 0, ["b0"], slot=2)) == (2, True)
        assert appended(produce(client, 1, ["b1"], slot=2)) == (4, False)
        commit(node)
        assert committed(client) == ["a0", "a1", "b0", "c0", "b1"]
        late = produce(client, 1, ["b1"], slot=2)  # its answer was lost: after the commit
        assert appended(late) == (4, True)
        assert committed(client) == ["a0", "a1", "b0", "c0", "b1"]


BAD_SLOTS: list[tuple[dict[str, Any], int]] = [
    ({"slot": 1, "records": [{"value": "x"}]}, 400),  # a slot needs a producer
    ({"slot": -1}, 422),
    ({"slot": 2**31}, 422),
    ({"slot": "one"}, 422),
]


@pytest.mark.slow
def test_bad_slots_are_refused_and_change_nothing(node: NodeProcess) -> None:
    with node.client() as client:
        for body, status in BAD_SLOTS:
            if "records" in body:
                response = client.post(f"/v1/partitions/{TOPIC}/0/records", json=body)
            else:
                response = produce(client, 0, ["x"], **body)
            assert response.status_code == status, response.text
            assert response.json()["error"]["code"] == "INVALID_REQUEST"
        for slot in (-1, 2**31):
            answer = client.get(f"/v1/partitions/{TOPIC}/0/producers", params={"slot": slot})
            assert answer.status_code == 422
        offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
        assert offsets["high_watermark"] == 0
        assert appended(produce(client, 0, ["x"], slot=2**31 - 1)) == (0, False)
