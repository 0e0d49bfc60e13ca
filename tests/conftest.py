"""Shared fixtures and the test layers.

Layers (``docs/testing.md``): ``unit`` tests start no process and touch no database or
network (``tests.support.unit_guard`` fails one that does); everything else needs real
processes, PostgreSQL or Spark and runs in parallel under pytest-xdist, with the tests of
one module-scoped fixture or one ``xdist_group`` lane kept on one worker
(``tests.support.xdist_groups``).

Clusters come from one factory (``tests.support.cluster``) in three scopes:
``cluster_factory`` (a test), ``module_cluster_factory`` (a module) and
``session_cluster_factory`` (the session, with ``.shared()`` for the common cluster).

The test process builds httpx's default TLS context once (``tests.support.tls_context``):
built per client, it was a fifth of the suite's CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from eos_cli.launcher import DEFAULT_PORT_RANGE, PORT_RANGE_ENV
from tests.support import jvm_archive, tls_context, zygote
from tests.support.children import Children
from tests.support.cluster import ClusterFactory
from tests.support.jvm_archive import TEST_JVM_OPTIONS
from tests.support.nodes import NodeProcess
from tests.support.unit_guard import UnitGuard

_ZYGOTE = pytest.StashKey["zygote.Zygote | None"]()

pytest_plugins = [
    "pytester",
    "tests.chaos.report",
    "tests.support.cpu_profile",
    "tests.support.failure_report",
    "tests.support.xdist_groups",
]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(UnitGuard(), "unit-guard")
    tls_context.install()
    # set before the xdist workers start, so that they and their children inherit it
    os.environ.setdefault("JAVA_TOOL_OPTIONS", jvm_archive.jvm_options(TEST_JVM_OPTIONS))
    _own_ports()
    config.stash[_ZYGOTE] = zygote.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    started = config.stash.get(_ZYGOTE, None)
    if started is not None:
        started.close()


def _own_ports() -> None:
    """Each xdist worker picks service ports in a slice of its own (``EOS_PORT_RANGE``):
    a test that kills a service and starts it again on its port must not find that port
    handed meanwhile to a cluster of another worker (seen: a coordinator's port answered
    by another test's storage node, ``POST /v1/topics`` → 404)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or PORT_RANGE_ENV in os.environ:
        return
    low, high = DEFAULT_PORT_RANGE
    width = (high - low) // count
    start = low + int(worker[2:]) * width
    os.environ[PORT_RANGE_ENV] = f"{start}-{start + width}"


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[ClusterFactory]:
    """Clusters for this test: ``cluster_factory(nodes=3, database="postgres")``."""
    with ClusterFactory(tmp_path / "clusters") as factory:
        yield factory


@pytest.fixture(scope="module")
def module_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterFactory]:
    """Clusters for the tests of one module, stopped when the module is done."""
    with ClusterFactory(tmp_path_factory.mktemp("clusters")) as factory:
        yield factory


@pytest.fixture(scope="session")
def session_cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """Clusters that live for the session (on each xdist worker); ``.shared(spec)``."""
    with ClusterFactory(tmp_path_factory.mktemp("clusters")) as factory:
        yield factory


@pytest.fixture
def children() -> Iterator[Children]:
    """Processes the test starts itself: stopped (SIGTERM, then SIGKILL) and reaped at its
    end, whatever happened (``tests/support/children.py``)."""
    started = Children()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[type[NodeProcess]]:
    """Start single node processes in this test's temp dir; all are stopped at the end."""
    started: list[NodeProcess] = []

    class TrackedNode(NodeProcess):
        def start(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if self not in started:
                started.append(self)
            return super().start(*args, **kwargs)

    yield TrackedNode
    for node in started:
        node.stop()
