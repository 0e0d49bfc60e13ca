"""Fixtures of the coordinator tests: a fresh PostgreSQL database per test (and an engine
on it, ``db``, for the tests that read or write its rows by hand), fake storage
nodes, and a factory of in-process coordinators that stops them all at the end. (Tests
with real processes take their cluster from ``cluster_factory``.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.coordinators import (
    FakeNodes,
    InProcessCoordinator,
    coordinator_settings,
    temp_database,
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temp_database() as url:
        yield url


@pytest.fixture
def db(pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def fake_nodes() -> FakeNodes:
    return FakeNodes()


CoordinatorFactory = Callable[..., InProcessCoordinator]


@pytest.fixture
def coordinator_factory(pg_url: str, fake_nodes: FakeNodes) -> Iterator[CoordinatorFactory]:
    started: list[InProcessCoordinator] = []

    def start(
        *, clock: Any = None, lease_clock: Any = None, background: bool = True,
        database_url: str | None = "postgres", **overrides: Any,
    ) -> InProcessCoordinator:
        url = pg_url if database_url == "postgres" else database_url or None
        settings = coordinator_settings(url, fake_nodes.spec, **overrides)
        coordinator = InProcessCoordinator(
            settings, clock=clock, lease_clock=lease_clock,
            node_transport=fake_nodes.transport, background=background,
        )
        started.append(coordinator)
        return coordinator.start()

    yield start
    for coordinator in reversed(started):
        coordinator.stop()


@pytest.fixture
def coordinator(coordinator_factory: CoordinatorFactory) -> InProcessCoordinator:
    return coordinator_factory()
