"""Fixtures of the Jepsen-style tests: clusters of hosts in network namespaces.

These tests need root and iproute2; where namespaces cannot be made they fail with the
reason rather than skip, so that a machine that silently cannot run them is noticed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.jepsen.hosts import HostCluster, HostSpec
from tests.jepsen.netns import netns_unavailable_reason

HostClusterFactory = Callable[..., HostCluster]


@pytest.fixture
def host_cluster_factory(tmp_path: Path) -> Iterator[HostClusterFactory]:
    """``host_cluster_factory(HostSpec(...), start=True)``: a cluster under ``tmp_path``;
    every cluster made is stopped at the end of the test."""
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.fail(f"the Jepsen tests need network namespaces: {reason}", pytrace=False)
    made: list[HostCluster] = []

    def make(spec: HostSpec | None = None, *, start: bool = True) -> HostCluster:
        cluster = HostCluster(tmp_path / f"hosts-{len(made) + 1}", spec or HostSpec())
        made.append(cluster)
        return cluster.start() if start else cluster

    yield make
    errors = []
    for cluster in reversed(made):
        try:
            cluster.stop()
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]
