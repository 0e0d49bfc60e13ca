"""DescribeProducers of many partitions (``POST /v1/producers/describe``) on a real node
process: one request answers every (partition, slot) as the per-partition GET answers it,
an entry the node cannot answer carries its own error beside the others, and a malformed
request is refused whole in the error envelope.

The node runs alone (it leads every partition it has); the entries it follows are in
``tests/integration/test_describe_producers_many.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eos_protocol.node import MAX_DESCRIBE_ENTRIES
from tests.support.envelope import envelope_problems
from tests.support.nodes import NodeProcess

DESCRIBE = "/v1/producers/describe"
TOPIC, OTHER = "described", "described-too"
PID, OTHER_PID, EPOCH = 91, 92, 1


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with TOPIC 0..3 and OTHER 0, written in slots:

    * TOPIC-0: PID in slot 1 up to sequence 4 (two batches), in slot 2 up to 0; OTHER_PID
      in slot 0 up to 2;
    * TOPIC-1: PID without a slot (slot 0) up to 1;
    * TOPIC-2: nothing; OTHER-0: PID in slot 7 up to 4.
    """
    process = NodeProcess(tmp_path_factory.mktemp("describe-many") / "data")
    process.start()
    for topic, partition in [(TOPIC, p) for p in range(4)] + [(OTHER, 0)]:
        process.create_partition(topic, partition)
    with process.client() as client:
        produce(client, TOPIC, 0, PID, 0, 3, slot=1)
        produce(client, TOPIC, 0, PID, 3, 2, slot=1)
        produce(client, TOPIC, 0, PID, 0, 1, slot=2)
        produce(client, TOPIC, 0, OTHER_PID, 0, 3)
        produce(client, TOPIC, 1, PID, 0, 2)
        produce(client, OTHER, 0, PID, 0, 5, slot=7)
    yield process
    process.stop()


def produce(client: httpx.Client, topic: str, partition: int, pid: int, seq: int, count: int,
            slot: int | None = None) -> None:  # fmt: skip
    records = [{"value": f"v{seq + i}"} for i in range(count)]
    body: dict[str, Any] = {"producer_id": pid, "producer_epoch": EPOCH, "base_sequence": seq,
                            "records": records}  # fmt: skip
    if slot is not None:
        body["slot"] = slot
    answer = client.post(f"/v1/partitions/{topic}/{partition}/records", json=body)
    assert answer.status_code == 200 and not answer.json()["duplicate"], answer.text


def entry(topic: str, partition: int, slot: int | None = None) -> dict[str, Any]:
    asked: dict[str, Any] = {"topic": topic, "partition": partition}
    if slot is not None:
        asked["slot"] = slot
    return asked


def last_of(pid: int, producers: list[dict[str, Any]]) -> int | None:
    """``pid``'s last sequence in an entry's rows (None: no row of it)."""
    found = [p["last_sequence"] for p in producers if p["producer_id"] == pid]
    return found[0] if found else None


def state(client: httpx.Client) -> list[Any]:
    """Every partition's producers (slots 0, 1, 2, 7) and offsets, by the GETs."""
    seen: list[Any] = []
    for topic, partition in [(TOPIC, p) for p in range(4)] + [(OTHER, 0)]:
        path = f"/v1/partitions/{topic}/{partition}"
        seen.append(client.get(f"{path}/offsets").json())
        for slot in (0, 1, 2, 7):
            seen.append(client.get(f"{path}/producers", params={"slot": slot}).json())
    return seen


def test_one_request_answers_every_partition_and_slot(node: NodeProcess) -> None:
    asked = [
        entry(TOPIC, 0, 1), entry(TOPIC, 0, 2), entry(TOPIC, 0), entry(TOPIC, 0, 9),
        entry(TOPIC, 1), entry(TOPIC, 2), entry(TOPIC, 3, 0), entry(OTHER, 0, 7),
    ]  # fmt: skip
    with node.client() as client:
        answer = client.post(DESCRIBE, json={"partitions": asked})
        assert answer.status_code == 200, answer.text
        entries = answer.json()["partitions"]
        assert [(e["topic"], e["partition"], e["slot"]) for e in entries] == [
            (a["topic"], a["partition"], a.get("slot", 0)) for a in asked
        ]
        assert all(e["error"] is None for e in entries), entries
        # PID's last sequence in each asked slot (-1: none there at its epoch; None: no row)
        assert [last_of(PID, e["producers"]) for e in entries] == [4, 0, -1, -1, 1, None, None, 4]
        assert [last_of(OTHER_PID, e["producers"]) for e in entries[:4]] == [-1, -1, 2, -1]
        assert all(p["slot"] == e["slot"] for e in entries for p in e["producers"])
        # the per-partition GET is still served, and answers each entry's rows exactly
        for a, e in zip(asked, entries, strict=True):
            single = client.get(f"/v1/partitions/{a['topic']}/{a['partition']}/producers",
                                params={"slot": a.get("slot", 0)})  # fmt: skip
            assert single.status_code == 200, single.text
            assert e["producers"] == single.json()["producers"]


def test_an_entry_the_node_cannot_answer_fails_alone(node: NodeProcess) -> None:
    asked = [entry(TOPIC, 0, 1), entry(TOPIC, 9), entry("nowhere", 0), entry(OTHER, 0, 7)]
    with node.client() as client:
        answer = client.post(DESCRIBE, json={"partitions": asked})
    assert answer.status_code == 200, answer.text
    fine, beyond, nowhere, other = answer.json()["partitions"]
    for refused in (beyond, nowhere):
        assert refused["producers"] == []
        assert refused["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
        assert refused["error"]["retriable"] is False  # the catalogue's flag
    assert "described-9" in beyond["error"]["message"]
    assert (fine["error"], other["error"]) == (None, None)
    assert (last_of(PID, fine["producers"]), last_of(PID, other["producers"])) == (4, 4)


#: Bodies refused whole, each with the status the contract gives it.
BAD: dict[str, tuple[Any, int]] = {
    "no body field": ({}, 422),
    "no entry": ({"partitions": []}, 422),
    "too many entries": (
        {"partitions": [entry(TOPIC, 0, s) for s in range(MAX_DESCRIBE_ENTRIES + 1)]}, 422),
    "a pair named twice": ({"partitions": [entry(TOPIC, 1), entry(TOPIC, 0, 1),
                                           entry(TOPIC, 1, 0)]}, 422),
    "a negative partition": ({"partitions": [entry(TOPIC, -1)]}, 422),
    "a partition past the limit": ({"partitions": [entry(TOPIC, 10_000)]}, 422),
    "a partition as text": ({"partitions": [entry(TOPIC, 0) | {"partition": "zero"}]}, 422),
    "a negative slot": ({"partitions": [entry(TOPIC, 0, -1)]}, 422),
    "a slot past 2^31-1": ({"partitions": [entry(TOPIC, 0, 2**31)]}, 422),
    "an illegal topic": ({"partitions": [entry("..", 0)]}, 422),
    "a misspelt field": ({"partitions": [{"topic": TOPIC, "partiton": 0}]}, 422),
    "not a list": ({"partitions": entry(TOPIC, 0)}, 422),
    "not JSON": ("{partitions", 422),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_request_is_refused_whole(node: NodeProcess, name: str) -> None:
    body, status = BAD[name]
    with node.client() as client:
        before = state(client)
        if isinstance(body, str):
            answer = client.post(DESCRIBE, content=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
        else:
            answer = client.post(DESCRIBE, json=body)
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == "INVALID_REQUEST", answer.text
        assert not envelope_problems(answer.status_code, answer.content)
        assert "partitions" not in answer.json()
        assert state(client) == before
