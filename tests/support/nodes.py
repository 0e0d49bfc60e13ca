"""A single storage-node process, for the tests of one node (its HTTP API, its recovery
after SIGKILL, its files): the launcher's ``ServiceProcess`` with the launcher's node
flags, the tests' internal token, and clients for the public and internal APIs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from eos_cli.launcher import ServiceProcess, free_port, node_args

INTERNAL_TOKEN = "test-internal-token-0123456789abcdef"


class NodeProcess(ServiceProcess):
    """``python -m partition_service`` on ``data_dir``; its log beside the directory.
    Without ``coordinator_url`` it verifies no transactional batch."""

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
        args = node_args(node_id, port, data_dir, coordinators=coordinator_url or "")
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            f"node {node_id}",
            [sys.executable, "-m", "partition_service", *args, *(extra or [])],
            port=port,
            log_path=data_dir.parent / f"node-{node_id}.log",
            env={**os.environ, "EOS_INTERNAL_TOKEN": INTERNAL_TOKEN},
            data_dir=data_dir,
        )
        self.node_id = node_id
        self.data_dir: Path = data_dir

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
