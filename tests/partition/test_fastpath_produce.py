"""The node's produce fast path against its route: two nodes in this process, one answering
through the fast path and one through the route, get the same requests and must answer the
same bytes, count the same errors and hold the same records.

Both start empty with the same partitions and rules, so every answer is comparable as it is
(the append time aside). The requests cover what the fast path answers (batches, retries,
errors of the log) and what it must leave to the route: other content types, bodies that do
not validate, path parameters the route refuses, callers it does not certainly admit.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from eos_protocol.acl import AclBinding, Operation, ResourceType
from eos_security.tokens import token_entry
from eos_server.fastpath import FastPathStats
from partition_service.app import create_app
from partition_service.context import NodeContext
from partition_service.settings import NodeSettings

pytestmark = pytest.mark.unit

INTERNAL_TOKEN = "produce-fast-path-internal-token-0123"
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
TOPIC = "orders"

Request = tuple[str, object, dict[str, str]]  # path, json body (or raw bytes), headers


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _batch(*values: str, **fields: object) -> dict[str, object]:
    return {"records": [{"key": f"k{i}", "value": v} for i, v in enumerate(values)], **fields}


def _idempotent(seq: int, *values: str, pid: int = 1000, **fields: object) -> dict[str, object]:
    return _batch(*values, producer_id=pid, producer_epoch=0, base_sequence=seq, **fields)


RECORDS = f"/v1/partitions/{TOPIC}/0/records"
ALICE_H, BOB_H = _as(ALICE), _as(BOB)
JSON = {"content-type": "application/json"}

REQUESTS: list[Request] = [
    (RECORDS, _batch("a"), ALICE_H),
    (RECORDS, _idempotent(0, "a", "b", "c"), ALICE_H),
    (RECORDS, _idempotent(0, "a", "b", "c"), ALICE_H),  # a retry: duplicate
    (RECORDS, _idempotent(7, "x"), ALICE_H),  # out of order
    (RECORDS, _idempotent(0, "t", pid=2000, transactional=True), ALICE_H),
    (RECORDS, _idempotent(1, "t2", pid=2000, transactional=True), ALICE_H),
    (RECORDS, _batch("v" * 2000), ALICE_H),  # a record over the node's limit
    (RECORDS, _batch("%%%", encoding="base64"), ALICE_H),  # not base64
    (RECORDS, _batch("a", producer_id=5), ALICE_H),  # a producer without its fields
    (RECORDS, _batch(), ALICE_H),  # no records
    (RECORDS, {**_batch("a"), "extra": 1}, ALICE_H),
    (RECORDS, b"{not json", {**ALICE_H, **JSON}),
    (RECORDS, b'{"records": [{"value": "a"}]}', {**ALICE_H, "content-type": "text/plain"}),
    (RECORDS, b'{"records": [{"value": "a"}]}', {**ALICE_H, **JSON, "content-encoding": "x"}),
    (f"/v1/partitions/{TOPIC}/1/records", _batch("b"), ALICE_H),
    (f"/v1/partitions/{TOPIC}/001/records", _batch("b"), ALICE_H),
    (f"/v1/partitions/{TOPIC}/9/records", _batch("c"), ALICE_H),  # no such partition
    (f"/v1/partitions/{TOPIC}/-1/records", _batch("c"), ALICE_H),
    ("/v1/partitions/Bad%20Topic/0/records", _batch("c"), ALICE_H),
    ("/v1/partitions/secret/0/records", _batch("c"), ALICE_H),  # may not know it exists
    (RECORDS, _batch("b"), BOB_H),  # refused
    (RECORDS, b"{not json", {**BOB_H, **JSON}),  # the body is judged first, as the route does
    (RECORDS, _batch("b"), {}),  # unauthenticated
    (RECORDS, _batch("z" * 70_000), ALICE_H),  # over the request limit
]


def _settings(root: Path) -> NodeSettings:
    tokens = root / "tokens.toml"
    root.mkdir(parents=True, exist_ok=True)
    tokens.write_text(token_entry("User:alice", ALICE) + token_entry("User:bob", BOB))
    return NodeSettings(
        data_dir=root / "data", internal_token=INTERNAL_TOKEN, auth_tokens_file=tokens,
        txn_verification="off", fsync=False, max_record_bytes=1000,
        max_request_bytes=64 * 1024,
    )


@asynccontextmanager
async def _node(root: Path, *, fast: bool) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(_settings(root))
    stats: FastPathStats = app.state.fast_paths
    stats.enabled = fast
    node: NodeContext = app.state.node
    node.access.authorizer.replace([
        AclBinding(principal="User:alice", resource_type=ResourceType.TOPIC,
                   resource_name=TOPIC, operation=Operation.WRITE),
    ])
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://node"
    ) as client:
        for partition in (0, 1, 2):
            created = await client.put(f"/internal/v1/partitions/{TOPIC}/{partition}",
                                       headers=_as(INTERNAL_TOKEN))
            assert created.status_code == 200, created.text
        yield app, client


def _comparable(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    body = re.sub(rb'"log_append_time_ms":\d+', b'"log_append_time_ms":T', response.content)
    return response.status_code, list(response.headers.items()), body


async def _run(root: Path, *, fast: bool) -> tuple[list[object], list[object], FastPathStats]:
    async with _node(root, fast=fast) as (app, client):
        answers: list[object] = []
        for path, body, headers in REQUESTS:
            if isinstance(body, bytes):
                response = await client.post(path, content=body, headers=headers)
            else:
                response = await client.post(path, json=body, headers=headers)
            answers.append(_comparable(response))
        fetched = await client.get(
            f"/v1/partitions/{TOPIC}/0/records", headers=_as(ALICE), params={"offset": 0}
        )
        node: NodeContext = app.state.node
        counted = [
            (sample.name, sample.labels, sample.value)
            for metric in (node.metrics.errors, node.metrics.produced_records,
                           node.metrics.duplicate_batches)
            for family in metric.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        ]
        engine = node.registry.get(TOPIC, 0).engine
        state = [engine.high_watermark, fetched.status_code, *counted]
        stats: FastPathStats = app.state.fast_paths
        return answers, state, stats


def test_produce_fast_path_answers_as_the_route(tmp_path: Path) -> None:
    routed, routed_state, routed_stats = asyncio.run(_run(tmp_path / "routed", fast=False))
    fast, fast_state, stats = asyncio.run(_run(tmp_path / "fast", fast=True))
    for request, expected, got in zip(REQUESTS, routed, fast, strict=True):
        assert got == expected, request[0]
    assert fast_state == routed_state
    assert routed_stats.answered == 0
    assert stats.answered >= 12  # the batches and the log's errors took the fast path
    assert stats.replayed >= 6  # the rest went to the route
