"""Several coordinators started at the same instant on a fresh database: the first-start
work (cluster id, ``__consumer_offsets``, lease rows) must not race into a crash."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from tests.support.coordinators import CoordinatorProcess, temp_database
from tests.support.nodes import NodeProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("attempt", range(3))
def test_two_coordinators_start_together_on_a_fresh_database(tmp_path: Path, attempt: int) -> None:
    node = NodeProcess(tmp_path / f"node-{attempt}")
    node.start()
    with temp_database() as url:
        coordinators = [
            CoordinatorProcess(
                tmp_path,
                database_url=url,
                nodes=f"1={node.url}",
                name=f"c{i}-{attempt}",
                extra=["--group-offset-partitions", "3"],
            )
            for i in range(2)
        ]
        errors: list[BaseException] = []

        def start(process: CoordinatorProcess) -> None:
            try:
                process.start()
            except BaseException as exc:  # reported below with the process log
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(c,)) for c in coordinators]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not errors, errors
            clusters = {
                httpx.get(f"{c.url}/v1/metadata").json()["cluster_id"] for c in coordinators
            }
            assert len(clusters) == 1
        finally:
            for process in coordinators:
                process.stop()
            node.stop()


def test_a_restart_with_the_same_instance_id_keeps_its_node_id(tmp_path: Path) -> None:
    """A fixed ``--instance-id`` (a stateful set, say) must survive a crash and restart."""
    node = NodeProcess(tmp_path / "node")
    node.start()
    try:
        with temp_database() as url:
            first = CoordinatorProcess(tmp_path, database_url=url, nodes=f"1={node.url}",
                                       extra=["--instance-id", "fixed-1"])
            first.start()
            found = httpx.get(f"{first.url}/v1/coordinators", params={"key": "t"}).json()
            first.kill()
            again = CoordinatorProcess(tmp_path, database_url=url, nodes=f"1={node.url}",
                                       port=first.port, extra=["--instance-id", "fixed-1"])
            again.start()
            try:
                after = httpx.get(f"{again.url}/v1/coordinators", params={"key": "t"}).json()
                assert after["node_id"] == found["node_id"]
            finally:
                again.stop()
    finally:
        node.stop()
