"""Storage-node processes for tests."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.processes import ServiceProcess, free_port

INTERNAL_TOKEN = "test-internal-token-0123456789abcdef"


class NodeProcess(ServiceProcess):
    def __init__(
        self,
        data_dir: Path,
        *,
        node_id: int = 1,
        port: int | None = None,
        coordinator_url: str | None = None,
        extra: list[str] | None = None,
    ) -> None:
        port = port or free_port()
        args = [
            "--node-id",
            str(node_id),
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--internal-token",
            INTERNAL_TOKEN,
            "--log-level",
            "warning",
        ]
        if coordinator_url:
            args += ["--coordinator-url", coordinator_url]
        else:
            args += ["--txn-verification", "off"]
        args += extra or []
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__("partition_service", args, port, data_dir.parent / f"node-{node_id}.log")
        self.node_id = node_id
        self.data_dir = data_dir

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0)

    def internal(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=30.0,
            headers={"Authorization": f"Bearer {INTERNAL_TOKEN}"},
        )

    def create_partition(self, topic: str, partition: int) -> None:
        with self.internal() as client:
            response = client.put(f"/internal/v1/partitions/{topic}/{partition}")
            response.raise_for_status()
