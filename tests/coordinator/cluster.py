"""A small real cluster for the process tests: storage nodes and coordinator processes on
loopback ports, sharing one throw-away PostgreSQL database."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.coordinators import CoordinatorProcess, temp_database
from tests.support.nodes import NodeProcess
from tests.support.processes import free_port, wait_until

OFFSET_PARTITIONS = 5


class Cluster:
    def __init__(self, tmp_path: Path, database_url: str, node_count: int = 2) -> None:
        self.tmp = tmp_path
        self.database_url = database_url
        self.coordinator_ports = [free_port(), free_port()]
        self.node_ports = {n: free_port() for n in range(1, node_count + 1)}
        self.nodes: dict[int, NodeProcess] = {}
        self.coordinators: list[CoordinatorProcess] = []

    @property
    def nodes_spec(self) -> str:
        return ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in self.node_ports.items())

    def start_node(self, node_id: int, verify_with: str) -> NodeProcess:
        node = NodeProcess(
            self.tmp / f"node-{node_id}", node_id=node_id, port=self.node_ports[node_id],
            coordinator_url=verify_with,
            extra=["--group-offset-partitions", str(OFFSET_PARTITIONS)],
        )
        node.start()
        self.nodes[node_id] = node
        return node

    def start_coordinator(self, index: int, *extra: str) -> CoordinatorProcess:
        coordinator = CoordinatorProcess(
            self.tmp, database_url=self.database_url, nodes=self.nodes_spec,
            name=f"c{index}", port=self.coordinator_ports[index],
            extra=["--group-offset-partitions", str(OFFSET_PARTITIONS), *extra],
        )
        coordinator.start()
        self.coordinators.append(coordinator)
        return coordinator

    def stop(self) -> None:
        for process in [*self.coordinators, *self.nodes.values()]:
            process.stop()


@contextlib.contextmanager
def running_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with temp_database() as url:
        c = Cluster(tmp_path, url)
        try:
            yield c
        finally:
            c.stop()


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
