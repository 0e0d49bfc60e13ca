"""Small helpers shared by the coordinator tests: the public API through a client, the
nodes' and coordinators' APIs by URL for the tests with real processes, and a
transaction's row read straight from the database."""

from __future__ import annotations

import time
from typing import Any

import httpx
import sqlalchemy as sa

from tests.support.processes import wait_until


def ok(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def init(client: httpx.Client, tid: str, **body: Any) -> tuple[int, int]:
    answer = ok(client.post(f"/v1/transactions/{tid}/init", json=body))
    return answer["producer_id"], answer["producer_epoch"]


def topic(client: httpx.Client, name: str = "orders", partitions: int = 4) -> Any:
    return ok(client.post("/v1/topics", json={"name": name, "partitions": partitions}))


def add(client: httpx.Client, tid: str, pid: int, epoch: int, *parts: int,
        topic: str = "orders") -> httpx.Response:
    return client.post(
        f"/v1/transactions/{tid}/partitions",
        json={"producer_id": pid, "producer_epoch": epoch,
              "partitions": [{"topic": topic, "partition": p} for p in parts]},
    )


def end(client: httpx.Client, tid: str, pid: int, epoch: int, action: str = "commit",
        wait: bool = True) -> httpx.Response:
    return client.post(
        f"/v1/transactions/{tid}/{action}",
        json={"producer_id": pid, "producer_epoch": epoch, "wait_for_markers": wait},
    )


def describe(client: httpx.Client, tid: str) -> dict[str, Any]:
    return dict(ok(client.get(f"/v1/transactions/{tid}")))


def produce(node_url: str, topic: str, partition: int, pid: int, epoch: int, seq: int,
            values: list[str]) -> dict[str, Any]:
    response = httpx.post(
        f"{node_url}/v1/partitions/{topic}/{partition}/records",
        json={"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq,
              "transactional": True, "records": [{"key": None, "value": v} for v in values]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def committed_values(node_url: str, topic: str, partition: int) -> list[str]:
    response = httpx.get(
        f"{node_url}/v1/partitions/{topic}/{partition}/records",
        params={"offset": 0, "isolation_level": "read_committed"}, timeout=30,
    )
    assert response.status_code == 200, response.text
    return [r["value"] for r in response.json()["records"]]


def state_of(url: str, tid: str) -> str:
    return str(httpx.get(f"{url}/v1/transactions/{tid}", timeout=10).json()["state"])


def wait_state(url: str, tid: str, state: str, timeout: float) -> float:
    """Poll until ``tid`` is in ``state``; returns the seconds it took."""
    start = time.monotonic()
    wait_until(lambda: state_of(url, tid) == state, timeout=timeout, interval=0.05,
               what=f"{tid} to reach {state}")
    return time.monotonic() - start


def leaders(url: str, topic: str) -> dict[int, int]:
    answer = httpx.get(f"{url}/v1/topics/{topic}", timeout=10).json()
    return {p["partition"]: p["leader"]["node_id"] for p in answer["partitions"]}


def transaction_row(database_url: str, tid: str) -> dict[str, Any]:
    """The ``transactions`` row of ``tid``, as the database holds it now."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT * FROM transactions WHERE transactional_id = :t"), {"t": tid}
            ).one()
            return dict(row._mapping)
    finally:
        engine.dispose()
