"""The node's batched internal endpoints, on a real node process: many partitions created
in one request (``POST /internal/v1/partitions``) and many partition states pushed in one
(``PUT /internal/v1/partition-states``). Each entry is answered on its own, a bad one
refused without failing the others; a malformed request is refused whole, in the error
envelope. Also, without a process: ``PartitionRegistry.create_many`` fsyncs the data
directory once per batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eos_protocol.node import MAX_PARTITIONS_PER_CREATE
from eos_protocol.replication import MAX_STATES_PER_PUSH
from partition_service import registry as registry_module
from partition_service.group_commit import Durability
from partition_service.log.log import LogConfig
from partition_service.partition import Limits
from partition_service.registry import NewPartition, PartitionRegistry
from tests.support.envelope import envelope_problems
from tests.support.nodes import NodeProcess

CREATE = "/internal/v1/partitions"
STATES = "/internal/v1/partition-states"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path_factory.mktemp("node-batches") / "data")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def internal(node: NodeProcess) -> Iterator[httpx.Client]:
    with node.internal() as client:
        yield client


def listed(internal: httpx.Client, topic: str) -> set[int]:
    rows = internal.get(CREATE).json()["partitions"]
    return {r["partition"] for r in rows if r["topic"] == topic}


def produce(node: NodeProcess, topic: str, partition: int, **fields: Any) -> httpx.Response:
    with node.client() as client:
        return client.post(f"/v1/partitions/{topic}/{partition}/records",
                           json={"records": [{"value": "v"}], **fields})  # fmt: skip


def state(topic: str, partition: int, **fields: Any) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "leader": 1, "leader_epoch": 1,
            "partition_epoch": 1, "replicas": [1], "isr": [1], **fields}  # fmt: skip


def test_a_batch_creates_many_partitions_and_refuses_a_bad_entry_alone(
    internal: httpx.Client,
) -> None:
    entries: list[dict[str, Any]] = [{"topic": "many", "partition": p} for p in range(1200)]
    entries[600:600] = [{"topic": "..", "partition": 0}, {"topic": "bad name!", "partition": 1},
                        {"topic": "", "partition": 2}]  # fmt: skip
    answer = internal.post(CREATE, json={"partitions": entries})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["partitions"]
    assert [(r["topic"], r["partition"]) for r in rows] == [
        (e["topic"], e["partition"]) for e in entries
    ]
    refused = {r["topic"]: r for r in rows if r["error"] is not None}
    assert set(refused) == {"..", "bad name!", ""}
    for r in refused.values():
        assert r["created"] is False
        assert r["error"]["code"] == "INVALID_REQUEST"
        assert "cannot create a partition of topic" in r["error"]["message"]
    assert all(r["created"] for r in rows if r["error"] is None)
    assert listed(internal, "many") == set(range(1200))
    assert not {"..", "bad name!", ""} & {r["topic"] for r in internal.get(CREATE).json()[
        "partitions"]}

    again = internal.post(CREATE, json={"partitions": [{"topic": "many", "partition": 7},
                                                       {"topic": "many", "partition": 1200}]})
    assert [(r["created"], r["error"]) for r in again.json()["partitions"]] == [
        (False, None), (True, None)
    ]
    # the one-partition route is still served, and agrees
    assert internal.put("/internal/v1/partitions/many/3").json()["created"] is False


def test_a_replicated_entry_waits_for_its_state_and_a_batch_push_applies_it(
    node: NodeProcess, internal: httpx.Client
) -> None:
    made = internal.post(CREATE, json={"partitions": [
        {"topic": "pushed", "partition": 0, "replicas": [1, 2]},
        {"topic": "pushed", "partition": 1},
    ]})  # fmt: skip
    assert all(r["created"] for r in made.json()["partitions"]), made.text
    waiting = produce(node, "pushed", 0, acks=1)
    assert waiting.status_code == 503, waiting.text  # one of two replicas: no leader yet
    assert produce(node, "pushed", 1).status_code == 200  # one replica: led here alone

    body = {"nodes": {"1": node.url}, "states": [
        state("pushed", 0, replicas=[1, 2], isr=[1]),
        state("pushed", 1),
        state("absent", 0),  # not on this node, and led here: not created
    ]}  # fmt: skip
    answer = internal.put(STATES, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["states"] == [
        {"topic": "pushed", "partition": 0, "applied": True},
        {"topic": "pushed", "partition": 1, "applied": True},
        {"topic": "absent", "partition": 0, "applied": False},
    ]
    assert "absent" not in {r["topic"] for r in internal.get(CREATE).json()["partitions"]}
    led = produce(node, "pushed", 0, acks=1)
    assert led.status_code == 200, led.text

    older = internal.put(STATES, json={"states": [state("pushed", 1, leader_epoch=0,
                                                        partition_epoch=0)]})  # fmt: skip
    assert older.json()["states"] == [{"topic": "pushed", "partition": 1, "applied": False}]
    unusable = internal.put(STATES, json={"states": [state("..", 0, leader=2, replicas=[1, 2]),
                                                     state("pushed", 1, partition_epoch=2)]})
    assert [s["applied"] for s in unusable.json()["states"]] == [False, True]
    # a field of a later version is ignored, as in a heartbeat answer
    later = internal.put(STATES, json={"states": [state("pushed", 1, partition_epoch=3,
                                                        preferred=[1])]})  # fmt: skip
    assert later.json()["states"] == [{"topic": "pushed", "partition": 1, "applied": True}]


BAD_CREATIONS: list[Any] = [
    {"partitions": []},
    {"partitions": [{"topic": "t", "partition": p} for p in range(MAX_PARTITIONS_PER_CREATE + 1)]},
    {"partitions": [{"topic": "t", "partition": "zero"}]},
    {"partitions": [{"topic": "t", "partition": -1}]},
    {"partitions": [{"topic": 5, "partition": 0}]},
    {"partitions": [{"topic": "t", "partition": 0, "replicas": "1,2"}]},
    {"partitions": [{"topic": "t", "partition": 0, "extra": 1}]},
    {"partitions": [{"topic": "x" * 250, "partition": 0}]},
    {"partitions": {"topic": "t", "partition": 0}},
    {},
    [],
]
BAD_PUSHES: list[Any] = [
    {"states": []},
    {"states": [state("t", p) for p in range(MAX_STATES_PER_PUSH + 1)]},
    {"states": [state("t", 0, leader="one")]},
    {"states": [{"topic": "t", "partition": 0}]},
    {"states": [state("t", 0)], "nodes": {"one": "http://x"}},
    {"states": [state("t", 0)], "extra": 1},
    {"states": [state("t", 0, replicas=[])]},
    {"states": [state("t", 0, partition_epoch=-1)]},
    {"states": [state("t", 10**30)]},
    {"states": [state("x" * 250, 0)]},
]


@pytest.mark.parametrize(("path", "body"), [*((CREATE, b) for b in BAD_CREATIONS),
                                            *((STATES, b) for b in BAD_PUSHES)])  # fmt: skip
def test_a_malformed_batch_is_refused_whole_in_the_envelope(
    internal: httpx.Client, path: str, body: Any
) -> None:
    before = internal.get(CREATE).json()["partitions"]
    answer = internal.request("POST" if path == CREATE else "PUT", path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    assert envelope_problems(answer.status_code, answer.content) == []
    assert internal.get(CREATE).json()["partitions"] == before


def test_the_batches_need_the_internal_token(node: NodeProcess) -> None:
    with node.client() as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            made = client.post(CREATE, json={"partitions": [{"topic": "sneaky", "partition": 0}]},
                               headers=headers)  # fmt: skip
            pushed = client.put(STATES, json={"states": [state("sneaky", 0)]}, headers=headers)
            for answer in (made, pushed):
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "UNAUTHENTICATED"
    with node.internal() as internal:
        assert listed(internal, "sneaky") == set()


def test_create_many_fsyncs_the_data_directory_once_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = registry_module.fsync_directory

    def counting(path: Path) -> None:
        synced.append(path)
        real(path)

    monkeypatch.setattr(registry_module, "fsync_directory", counting)
    registry = PartitionRegistry(
        tmp_path, log_config=LogConfig(),
        durability=Durability(fsync=False, checkpoint_interval_ms=60_000,
                              inline_fsync_under_us=0),
        limits=Limits(), group_offset_partitions=1,
    )  # fmt: skip

    async def scenario() -> tuple[list[bool], list[bool], bool, bool]:
        try:
            wanted = [NewPartition("t", p, replicated=p % 2 == 0) for p in range(100)]
            first = await registry.create_many([*wanted, NewPartition("t", 3)])
            again = await registry.create_many(wanted[:3])
            single = await registry.create("t", 100)
            return first, again, single, await registry.create("t", 100)
        finally:
            await registry.stop()

    first, again, single, single_again = asyncio.run(scenario())
    assert first == [True] * 100 + [False]  # a key asked twice is created once
    assert (again, single, single_again) == ([False] * 3, True, False)
    assert synced == [tmp_path, tmp_path]  # the batch of 100, then the single one
    assert registry.partitions[("t", 0)].role.awaits_controller
    assert not registry.partitions[("t", 1)].role.awaits_controller
    with pytest.raises(Exception, match="invalid topic name"):
        asyncio.run(registry.create_many([NewPartition("ok", 0), NewPartition("..", 0)]))
    assert ("ok", 0) not in registry.partitions
