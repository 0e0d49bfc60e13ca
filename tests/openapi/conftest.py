"""Fixtures of the OpenAPI tests: the real cluster shared by the session (a coordinator and
two storage nodes, all processes), for the conformance checks and the generated clients."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, ClusterFactory

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi"


@pytest.fixture(scope="session")
def openapi_cluster(session_cluster_factory: ClusterFactory) -> Cluster:
    return session_cluster_factory.shared()
