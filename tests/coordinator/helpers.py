"""Small HTTP helpers shared by the coordinator tests."""

from __future__ import annotations

from typing import Any

import httpx


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
