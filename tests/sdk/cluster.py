"""A real EOS cluster for the SDK tests: one coordinator process (SQLite) and two storage
node processes that verify transactional batches with it (KIP-890), on loopback ports."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.nodes import INTERNAL_TOKEN, NodeProcess
from tests.support.processes import ServiceProcess, free_port

GROUP_OFFSET_PARTITIONS = 5


class SqliteCoordinator(ServiceProcess):
    """``python -m coordinator_service`` on SQLite in ``data_dir``."""

    def __init__(
        self, data_dir: Path, nodes: str, port: int | None = None, extra: list[str] | None = None
    ) -> None:
        port = port or free_port()
        args = [
            "--port", str(port),
            "--data-dir", str(data_dir),
            "--nodes", nodes,
            "--internal-token", INTERNAL_TOKEN,
            "--group-offset-partitions", str(GROUP_OFFSET_PARTITIONS),
            "--marker-backoff-max-ms", "200",
            "--reconcile-interval-ms", "100",
            "--log-level", "warning",
            *(extra or []),
        ]
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__("coordinator_service", args, port, data_dir.parent / "coordinator.log")


@dataclass
class Cluster:
    coordinator: SqliteCoordinator
    nodes: list[NodeProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.coordinator.url

    def create_topic(self, partitions: int = 2, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        response = httpx.post(f"{self.url}/v1/topics",
                              json={"name": name, "partitions": partitions}, timeout=30)
        response.raise_for_status()
        return name

    def stop(self) -> None:
        self.coordinator.stop()
        for node in self.nodes:
            node.stop()


def start_cluster(
    root: Path, node_count: int = 2, fsync: bool = False, coordinator_extra: list[str] | None = None
) -> Cluster:
    coordinator_port = free_port()
    coordinator_url = f"http://127.0.0.1:{coordinator_port}"
    extra = ["--group-offset-partitions", str(GROUP_OFFSET_PARTITIONS)]
    if not fsync:
        extra.append("--no-fsync")
    nodes = [
        NodeProcess(root / f"node-{i}", node_id=i, coordinator_url=coordinator_url, extra=extra)
        for i in range(1, node_count + 1)
    ]
    for node in nodes:
        node.start()
    spec = ",".join(f"{n.node_id}={n.url}" for n in nodes)
    coordinator = SqliteCoordinator(
        root / "coordinator", spec, port=coordinator_port, extra=coordinator_extra
    )
    cluster = Cluster(coordinator, nodes)
    try:
        coordinator.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
