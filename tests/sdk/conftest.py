"""Fixtures of the SDK tests: the real cluster shared by the session, and the ``twin`` fixture that
runs a test body against the blocking clients and against their async twins."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import sdk
from tests.sdk.bridge import AsyncBridge, Blocking
from tests.sdk.faults import FaultyServer, Plan
from tests.support.cluster import Cluster, ClusterFactory


@pytest.fixture(scope="session")
def cluster(session_cluster_factory: ClusterFactory) -> Cluster:
    """The session's shared cluster (the Spark and OpenAPI tests use the same one)."""
    return session_cluster_factory.shared()


@pytest.fixture(scope="session")
def bridge() -> Iterator[AsyncBridge]:
    running = AsyncBridge()
    yield running
    running.close()


class Twin:
    """Builds clients of one flavour; async ones are wrapped to look blocking."""

    def __init__(self, kind: str, bridge: AsyncBridge) -> None:
        self.kind = kind
        self.bridge = bridge
        self._made: list[Any] = []
        self._servers: list[FaultyServer] = []

    def _make(self, sync_cls: type, async_cls: type, *args: Any, **kwargs: Any) -> Any:
        if self.kind == "sync":
            client = sync_cls(*args, **kwargs)
        else:
            client = Blocking(self.bridge.call(lambda: async_cls(*args, **kwargs)), self.bridge)
        self._made.append(client)
        return client

    def transactional_producer(self, url: str, tid: str, **kw: Any) -> Any:
        return self._make(sdk.TransactionalProducer, sdk.AsyncTransactionalProducer, url, tid, **kw)

    def producer(self, url: str, **kw: Any) -> Any:
        return self._make(sdk.Producer, sdk.AsyncProducer, url, **kw)

    def consumer(self, url: str, group_id: str | None = None, **kw: Any) -> Any:
        return self._make(sdk.Consumer, sdk.AsyncConsumer, url, group_id, **kw)

    def admin(self, url: str, **kw: Any) -> Any:
        return self._make(sdk.AdminClient, sdk.AsyncAdminClient, url, **kw)

    def faulty(self, plan: Plan) -> FaultyServer:
        """A fault-injecting server of this flavour (see ``faults.py``), closed at the end."""
        server = FaultyServer(plan)
        self._servers.append(server)
        return server

    def close_all(self) -> None:
        for client in reversed(self._made):
            with contextlib.suppress(Exception):  # closed already, or fenced
                client.close()
        for server in self._servers:
            server.close_sync()
            self.bridge.run(server.aclose())


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest, bridge: AsyncBridge) -> Iterator[Twin]:
    made = Twin(request.param, bridge)
    yield made
    made.close_all()
