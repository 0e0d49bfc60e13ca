"""Structured logs from real processes: every line is one JSON object, and the lines about
a transaction carry its transactional id, producer id and epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.coordinators import CoordinatorProcess
from tests.support.nodes import INTERNAL_TOKEN, NodeProcess
from tests.support.processes import free_port, wait_until

pytestmark = pytest.mark.slow


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # fails the test on any non-JSON line


def test_logs_are_json_with_transaction_fields(tmp_path: Path) -> None:
    node_port = free_port()
    node = NodeProcess(
        tmp_path / "node",
        port=node_port,
        coordinator_url="http://127.0.0.1:1",  # not used: no produce here
        extra=["--group-offset-partitions", "2", "--log-level", "debug"],
    )
    node.start()
    coordinator = CoordinatorProcess(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'c.db'}",
        nodes=f"1=http://127.0.0.1:{node_port}",
        extra=["--group-offset-partitions", "2", "--log-level", "debug"],
    )
    coordinator.start()
    try:
        url = coordinator.url
        assert (
            httpx.post(f"{url}/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        )
        ident = httpx.post(f"{url}/v1/transactions/logged/init", json={}).json()
        body = {"producer_id": ident["producer_id"], "producer_epoch": ident["producer_epoch"]}
        httpx.post(
            f"{url}/v1/transactions/logged/partitions",
            json={**body, "partitions": [{"topic": "t", "partition": 0}]},
        )
        done = httpx.post(
            f"{url}/v1/transactions/logged/commit", json={**body, "wait_for_markers": True}
        )
        assert done.status_code == 200, done.text
        httpx.post(f"{url}/v1/transactions/logged/init", json={})  # fences the first producer

        def transitions() -> list[dict[str, Any]]:
            return [
                r for r in json_lines(coordinator.log_path) if r.get("transactional_id") == "logged"
            ]

        wait_until(lambda: len(transitions()) >= 3, what="transaction log lines")
        for record in transitions():
            assert record["service"] == "coordinator"
            assert record["producer_id"] == ident["producer_id"]
            assert isinstance(record["producer_epoch"], int)
            assert record["ts"].endswith("Z") and record["level"] and record["message"]
        states = {r.get("to_state") for r in transitions()}
        assert {"Ongoing", "PrepareCommit", "CompleteCommit"} <= states

        marker_lines = [
            r for r in json_lines(node.log_path) if r.get("logger") == "eos.node.markers"
        ]
        assert marker_lines, "the node logged no marker line"
        assert all(
            r["producer_id"] == ident["producer_id"] and "producer_epoch" in r for r in marker_lines
        )
        text = coordinator.log_path.read_text() + node.log_path.read_text()
        assert INTERNAL_TOKEN not in text, "the internal token must never be logged"
    finally:
        coordinator.stop()
        node.stop()
