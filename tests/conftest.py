"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nodes import NodeProcess


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[type[NodeProcess]]:
    """Start node processes in this test's temp dir; all are stopped at the end."""
    started: list[NodeProcess] = []

    class TrackedNode(NodeProcess):
        def start(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if self not in started:
                started.append(self)
            return super().start(*args, **kwargs)

    yield TrackedNode
    for node in started:
        node.stop()
