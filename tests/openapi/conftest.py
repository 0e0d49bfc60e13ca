"""Fixtures of the OpenAPI tests: one real cluster (a coordinator and two storage nodes, all
processes) shared by the conformance checks and the generated clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sdk.cluster import Cluster, start_cluster

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi"


@pytest.fixture(scope="session")
def openapi_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("eos-openapi-cluster")
    started = start_cluster(root)
    yield started
    started.stop()
