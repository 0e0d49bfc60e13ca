"""The storage node over HTTP, as a real process on a loopback port."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eos_protocol.partitioning import group_offsets_partition
from tests.support.nodes import INTERNAL_TOKEN, NodeProcess

TOPIC = "orders"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("node-http")
    process = NodeProcess(
        root / "data", extra=["--group-offset-partitions", "4", "--max-record-bytes", "1000"]
    )
    process.start()
    for p in range(3):
        process.create_partition(TOPIC, p)
    for p in range(4):
        process.create_partition("__consumer_offsets", p)
    yield process
    process.stop()


@pytest.fixture
def client(node: NodeProcess) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c


def offsets(client: httpx.Client, partition: int) -> dict[str, int]:
    response = client.get(f"/v1/partitions/{TOPIC}/{partition}/offsets")
    assert response.status_code == 200
    return dict(response.json())


def markers(
    node: NodeProcess,
    pid: int,
    epoch: int,
    result: str,
    parts: list[tuple[str, int]],
    coordinator_epoch: int = 0,
) -> list[dict[str, object]]:
    body = {
        "markers": [
            {
                "producer_id": pid,
                "producer_epoch": epoch,
                "coordinator_epoch": coordinator_epoch,
                "result": result,
                "partitions": [{"topic": t, "partition": p} for t, p in parts],
            }
        ]
    }
    with node.internal() as internal:
        response = internal.post("/internal/v1/markers", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["results"])


def fetch(
    client: httpx.Client, partition: int, offset: int = 0, isolation: str = "read_committed"
) -> list[str]:
    out: list[str] = []
    while True:
        response = client.get(
            f"/v1/partitions/{TOPIC}/{partition}/records",
            params={"offset": offset, "isolation_level": isolation, "max_records": 3},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        out.extend(r["value"] for r in body["records"])
        if body["next_offset"] == offset:
            return out
        offset = body["next_offset"]


def test_produce_then_fetch(client: httpx.Client) -> None:
    response = client.post(
        f"/v1/partitions/{TOPIC}/0/records",
        json={"records": [{"key": "k", "value": "hello", "headers": {"h": "1"}}]},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["duplicate"] is False and body["base_offset"] == body["last_offset"]
    fetched = client.get(
        f"/v1/partitions/{TOPIC}/0/records", params={"offset": body["base_offset"]}
    ).json()
    record = fetched["records"][0]
    assert (record["key"], record["value"], record["headers"]) == ("k", "hello", {"h": "1"})
    assert fetched["high_watermark"] == body["last_offset"] + 1


def test_idempotent_retry_is_a_duplicate_with_first_offsets(client: httpx.Client) -> None:
    batch = {
        "producer_id": 500,
        "producer_epoch": 0,
        "base_sequence": 0,
        "records": [{"value": "a"}, {"value": "b"}],
    }
    first = client.post(f"/v1/partitions/{TOPIC}/1/records", json=batch).json()
    retry = client.post(f"/v1/partitions/{TOPIC}/1/records", json=batch).json()
    assert retry["duplicate"] is True
    assert (retry["base_offset"], retry["last_offset"]) == (
        first["base_offset"],
        first["last_offset"],
    )
    gap = client.post(f"/v1/partitions/{TOPIC}/1/records", json={**batch, "base_sequence": 5})
    assert gap.status_code == 409
    assert gap.json()["error"]["code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"


def test_transaction_visible_only_after_commit_and_aborted_never(
    node: NodeProcess, client: httpx.Client
) -> None:
    before = fetch(client, 2)
    for pid, value in ((600, "committed"), (601, "aborted")):
        response = client.post(
            f"/v1/partitions/{TOPIC}/2/records",
            json={
                "producer_id": pid,
                "producer_epoch": 0,
                "base_sequence": 0,
                "transactional": True,
                "records": [{"value": value}],
            },
        )
        assert response.status_code == 200, response.text
    state = offsets(client, 2)
    assert state["last_stable_offset"] < state["high_watermark"]
    assert fetch(client, 2) == before
    assert fetch(client, 2, isolation="read_uncommitted")[-2:] == ["committed", "aborted"]
    assert markers(node, 601, 0, "ABORT", [(TOPIC, 2)])[0]["error"] is None
    assert fetch(client, 2) == before  # 600 still open holds the LSO
    assert markers(node, 600, 0, "COMMIT", [(TOPIC, 2)])[0]["error"] is None
    assert fetch(client, 2) == [*before, "committed"]
    state = offsets(client, 2)
    assert state["last_stable_offset"] == state["high_watermark"]
    producers = client.get(f"/v1/partitions/{TOPIC}/2/producers").json()["producers"]
    assert {p["producer_id"] for p in producers} >= {600, 601}
    assert all(p["current_txn_start_offset"] is None for p in producers)


def test_markers_report_per_partition_errors(node: NodeProcess) -> None:
    results = markers(node, 700, 0, "COMMIT", [(TOPIC, 0), ("missing-topic", 0)])
    errors = {(r["topic"], r["error"]) for r in results}
    assert errors == {(TOPIC, None), ("missing-topic", "UNKNOWN_TOPIC_OR_PARTITION")}


def test_base64_records_round_trip(client: httpx.Client) -> None:
    raw = bytes(range(256))
    encoded = base64.b64encode(raw).decode()
    response = client.post(
        f"/v1/partitions/{TOPIC}/0/records",
        json={"encoding": "base64", "records": [{"value": encoded}]},
    )
    assert response.status_code == 200
    offset = response.json()["base_offset"]
    record = client.get(f"/v1/partitions/{TOPIC}/0/records", params={"offset": offset}).json()[
        "records"
    ][0]
    assert record["encoding"] == "base64"
    assert base64.b64decode(record["value"]) == raw


BAD_PRODUCES = [
    ("missing", 0, {"records": [{"value": "x"}]}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    (TOPIC, 0, {"records": []}, 400, "INVALID_RECORD"),
    (TOPIC, 0, {"records": [{"value": "x" * 1001}]}, 413, "MESSAGE_TOO_LARGE"),
    (
        TOPIC,
        0,
        {"encoding": "base64", "records": [{"value": "not base64!"}]},
        400,
        "INVALID_RECORD",
    ),
    (TOPIC, 0, {"transactional": True, "records": [{"value": "x"}]}, 400, "INVALID_REQUEST"),
    (TOPIC, 0, {"producer_id": 1, "records": [{"value": "x"}]}, 400, "INVALID_REQUEST"),
    (TOPIC, 0, {"encoding": "utf16", "records": [{"value": "x"}]}, 422, "INVALID_REQUEST"),
    (TOPIC, 0, {"records": [{"value": "x"}], "extra": 1}, 422, "INVALID_REQUEST"),
    (
        TOPIC,
        0,
        {"producer_id": -4, "producer_epoch": 0, "base_sequence": 0, "records": [{"value": "x"}]},
        422,
        "INVALID_REQUEST",
    ),
    (
        TOPIC,
        0,
        {
            "producer_id": 2**70,
            "producer_epoch": 0,
            "base_sequence": 0,
            "records": [{"value": "x"}],
        },
        422,
        "INVALID_REQUEST",
    ),
]


@pytest.mark.parametrize(("topic", "partition", "body", "status", "code"), BAD_PRODUCES)
def test_bad_produce_gets_envelope_and_changes_nothing(
    client: httpx.Client,
    topic: str,
    partition: int,
    body: dict[str, object],
    status: int,
    code: str,
) -> None:
    before = offsets(client, 0)
    response = client.post(f"/v1/partitions/{topic}/{partition}/records", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["retriable"] is False
    assert offsets(client, 0) == before


def test_malformed_json_and_invalid_utf8(client: httpx.Client) -> None:
    before = offsets(client, 0)
    for content in (b"{not json", b'{"records": [{"value": "\xff\xfe"}]}'):
        response = client.post(
            f"/v1/partitions/{TOPIC}/0/records",
            content=content,
            headers={"content-type": "application/json"},
        )
        assert response.status_code in (400, 422)
        assert response.json()["error"]["code"] == "INVALID_REQUEST"
    assert offsets(client, 0) == before


@pytest.mark.parametrize(
    "params",
    [
        {"offset": -1},
        {"offset": 0, "max_records": 0},
        {"isolation_level": "dirty"},
        {"offset": "x"},
    ],
)
def test_bad_fetch_parameters(client: httpx.Client, params: dict[str, Any]) -> None:
    response = client.get(f"/v1/partitions/{TOPIC}/0/records", params=params)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "INVALID_REQUEST"


def test_fetch_past_end_is_out_of_range(client: httpx.Client) -> None:
    end = offsets(client, 0)["high_watermark"]
    response = client.get(f"/v1/partitions/{TOPIC}/0/records", params={"offset": end + 10})
    assert response.status_code == 416
    assert response.json()["error"]["code"] == "OFFSET_OUT_OF_RANGE"


def test_long_poll_returns_when_records_arrive(node: NodeProcess, client: httpx.Client) -> None:
    import threading

    end = offsets(client, 1)["high_watermark"]
    answer: dict[str, object] = {}

    def poll() -> None:
        with node.client() as other:
            answer.update(
                other.get(
                    f"/v1/partitions/{TOPIC}/1/records",
                    params={"offset": end, "max_wait_ms": 20000},
                ).json()
            )

    thread = threading.Thread(target=poll)
    thread.start()
    client.post(f"/v1/partitions/{TOPIC}/1/records", json={"records": [{"value": "late"}]})
    thread.join(timeout=20)
    assert not thread.is_alive()
    records = answer["records"]
    assert isinstance(records, list) and records[0]["value"] == "late"


def test_internal_endpoints_need_the_internal_token(
    node: NodeProcess, client: httpx.Client
) -> None:
    pid = 800
    client.post(
        f"/v1/partitions/{TOPIC}/0/records",
        json={
            "producer_id": pid,
            "producer_epoch": 0,
            "base_sequence": 0,
            "transactional": True,
            "records": [{"value": "pending"}],
        },
    )
    before = offsets(client, 0)
    body = {
        "markers": [
            {
                "producer_id": pid,
                "producer_epoch": 0,
                "coordinator_epoch": 0,
                "result": "COMMIT",
                "partitions": [{"topic": TOPIC, "partition": 0}],
            }
        ]
    }
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": INTERNAL_TOKEN}):
        response = client.post("/internal/v1/markers", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "UNAUTHENTICATED"
        created = client.put("/internal/v1/partitions/sneaky/0", headers=headers)
        assert created.status_code == 401
    assert offsets(client, 0) == before
    with node.internal() as internal:
        listed = internal.get("/internal/v1/partitions").json()["partitions"]
    assert "sneaky" not in {p["topic"] for p in listed}
    markers(node, pid, 0, "ABORT", [(TOPIC, 0)])


def test_group_offsets_plain_and_transactional(node: NodeProcess, client: httpx.Client) -> None:
    group = "billing"
    commit = client.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": "in", "partition": 0, "offset": 10}]},
    )
    assert commit.status_code == 200
    assert client.get(f"/v1/groups/{group}/offsets").json()["offsets"] == [
        {"topic": "in", "partition": 0, "offset": 10, "metadata": None}
    ]
    txn = client.post(
        f"/v1/groups/{group}/txn-offsets",
        json={
            "transactional_id": "copier-0",
            "producer_id": 900,
            "producer_epoch": 0,
            "offsets": [{"topic": "in", "partition": 0, "offset": 25, "metadata": "m"}],
        },
    )
    assert txn.status_code == 200, txn.text
    unstable = client.get(f"/v1/groups/{group}/offsets", params={"require_stable": True})
    assert unstable.status_code == 503
    assert unstable.json()["error"]["code"] == "UNSTABLE_OFFSET_COMMIT"
    assert unstable.json()["error"]["retriable"] is True
    loose = client.get(f"/v1/groups/{group}/offsets", params={"require_stable": False})
    assert loose.json()["offsets"][0]["offset"] == 10
    offsets_partition = ("__consumer_offsets", group_offsets_partition(group, 4))
    results = markers(node, 900, 0, "COMMIT", [offsets_partition])
    assert results[0]["error"] is None
    assert client.get(f"/v1/groups/{group}/offsets").json()["offsets"][0]["offset"] == 25


def test_records_produced_to_the_offsets_topic_are_refused_and_change_nothing(
    client: httpx.Client,
) -> None:
    """Only the offset commits write ``__consumer_offsets``: a produce there, single or in a
    multi-partition request, is INVALID_REQUEST and writes nothing (it used to be written,
    then fail the group view with a 500)."""
    group = "poisoned"
    partition = group_offsets_partition(group, 4)
    path = f"/v1/partitions/__consumer_offsets/{partition}"
    end = client.get(f"{path}/offsets").json()["high_watermark"]
    for records in ([{"key": "x", "value": "y"}], [{"key": None, "value": None}]):
        single = client.post(f"{path}/records", json={"records": records})
        assert single.status_code == 400, single.text
        assert single.json()["error"]["code"] == "INVALID_REQUEST"
        assert "internal" in single.json()["error"]["message"]
        many = client.post("/v1/produce", json={"batches": [
            {"topic": "__consumer_offsets", "partition": partition, "records": records},
            {"topic": TOPIC, "partition": 0, "records": [{"value": "beside it"}]},
        ]})  # fmt: skip
        assert many.status_code == 200, many.text
        refused, accepted = many.json()["batches"]
        assert refused["error"]["code"] == "INVALID_REQUEST", refused
        assert accepted["error"] is None, accepted
    assert client.get(f"{path}/offsets").json()["high_watermark"] == end
    body = {"offsets": [{"topic": "in", "partition": 0, "offset": 4}]}
    commit = client.post(f"/v1/groups/{group}/offsets", json=body)
    assert commit.status_code == 200, commit.text
    assert client.get(f"/v1/groups/{group}/offsets").json()["offsets"][0]["offset"] == 4


def test_group_on_a_node_without_its_offsets_partition(tmp_path: Path) -> None:
    lonely = NodeProcess(tmp_path / "lonely")
    lonely.start()
    try:
        with lonely.client() as c:
            response = c.get("/v1/groups/g/offsets")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "NOT_COORDINATOR"
    finally:
        lonely.stop()


def test_health_ready_metrics_and_openapi(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    metrics = client.get("/metrics").text
    assert 'eos_node_high_watermark{partition="0",topic="orders"}' in metrics
    assert "eos_node_lso_lag" in metrics
    spec = client.get("/openapi.json").json()
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "produceRecords",
        "fetchRecords",
        "writeTxnMarkers",
        "createPartition",
        "commitTransactionalOffsets",
        "describeProducers",
    } <= operations
    produce_op = spec["paths"]["/v1/partitions/{topic}/{partition}/records"]["post"]
    assert {"409", "413", "503"} <= set(produce_op["responses"])


def test_lone_surrogate_is_an_invalid_record(client: httpx.Client) -> None:
    before = offsets(client, 0)
    response = client.post(f"/v1/partitions/{TOPIC}/0/records",
                           content=b'{"records": [{"value": "\\ud800"}]}',
                           headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "INVALID_RECORD"
    assert offsets(client, 0) == before


def test_oversized_bodies_declared_or_streamed_get_413(tmp_path: Path) -> None:
    small = NodeProcess(tmp_path / "small", extra=["--max-request-bytes", "2048"])
    small.start()
    small.create_partition(TOPIC, 0)
    body = b'{"records": [{"value": "' + b"x" * 4096 + b'"}]}'

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 512):
            yield body[i : i + 512]

    try:
        with small.client() as c:
            for content in (body, chunks()):
                response = c.post(f"/v1/partitions/{TOPIC}/0/records", content=content,
                                  headers={"content-type": "application/json"})
                assert response.status_code == 413, response.text
                assert response.json()["error"]["code"] == "MESSAGE_TOO_LARGE"
            ok = c.post(f"/v1/partitions/{TOPIC}/0/records",
                        content=iter([b'{"records": [{"value": ', b'"fits"}]}']),
                        headers={"content-type": "application/json"})
            assert ok.status_code == 200, ok.text
            assert c.get(f"/v1/partitions/{TOPIC}/0/offsets").json()["high_watermark"] == 1
    finally:
        small.stop()


def test_error_answers_are_counted(client: httpx.Client) -> None:
    def count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('eos_node_errors_total{code="UNKNOWN_TOPIC_OR_PARTITION"}'):
                return float(line.split()[-1])
        return 0.0

    before = count()
    client.get("/v1/partitions/nowhere/0/offsets")
    assert count() == before + 1
