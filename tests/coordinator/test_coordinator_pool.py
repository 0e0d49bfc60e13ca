"""A storage node's coordinator pool (partition_service/coordinators.py) against a real
in-process coordinator and two bad peers on real sockets: one that refuses connections
(a killed process) and one that accepts and never answers (a paused process that still
holds its sockets, the harder case). The node must verify through the live instance, set
the bad ones aside, and learn the live instances from the cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from eos_protocol.common import TopicPartition
from eos_protocol.errors import CoordinatorNotAvailableError
from partition_service.coordinators import CoordinatorPool
from partition_service.verification import CoordinatorVerifier
from tests.coordinator.helpers import add, init, ok, topic
from tests.support.coordinators import INTERNAL_TOKEN, InProcessCoordinator
from tests.support.processes import free_port

TP = TopicPartition(topic="orders", partition=1)


@asynccontextmanager
async def silent_peer() -> AsyncIterator[str]:
    """A listener that accepts connections and reads, but never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


def _ongoing(coordinator: InProcessCoordinator) -> tuple[int, int]:
    with coordinator.client() as client:
        topic(client)
        pid, epoch = init(client, "pool")
        ok(add(client, "pool", pid, epoch, 1))
    return pid, epoch


def test_dead_and_paused_instances_are_passed_over(coordinator: InProcessCoordinator) -> None:
    pid, epoch = _ongoing(coordinator)
    dead = f"http://127.0.0.1:{free_port()}"

    async def check() -> None:
        async with silent_peer() as paused:
            pool = CoordinatorPool([paused, dead, coordinator.url], INTERNAL_TOKEN, timeout_s=0.5)
            verifier = CoordinatorVerifier(pool)
            try:
                started = time.monotonic()
                assert (await verifier.verify(pid, epoch, TP)).transactional_id == "pool"
                first = time.monotonic() - started
                # the paused peer is not waited for to its timeout: the next ones are
                # asked after the hedge delay (an eighth of a second here)
                assert first < 0.5, first
                assert pool.candidates()[0] == coordinator.url
                assert set(pool.candidates()[1:]) == {paused, dead}
                started = time.monotonic()
                for _ in range(20):
                    await verifier.verify(pid, epoch, TP)
                # the live one is preferred now: no request waits for the paused peer
                assert time.monotonic() - started < 20 * 0.1
            finally:
                await pool.close()

    asyncio.run(check())


def test_all_instances_down_is_coordinator_not_available() -> None:
    async def check() -> None:
        async with silent_peer() as paused:
            dead = f"http://127.0.0.1:{free_port()}"
            pool = CoordinatorPool([dead, paused], INTERNAL_TOKEN, timeout_s=0.3)
            try:
                with pytest.raises(CoordinatorNotAvailableError) as info:
                    await CoordinatorVerifier(pool).verify(1, 0, TP)
                assert dead in str(info.value) and paused in str(info.value)
            finally:
                await pool.close()

    asyncio.run(check())


@pytest.mark.unit
def test_set_aside_instances_come_back_first_by_time() -> None:
    now = [100.0]
    pool = CoordinatorPool(
        ["http://a:1", "http://b:1", "http://c:1"], None, timeout_s=1, down_s=5,
        clock=lambda: now[0],
    )
    assert pool.candidates() == ["http://a:1", "http://b:1", "http://c:1"]
    pool.set_aside("http://a:1")
    now[0] += 1
    pool.set_aside("http://b:1")
    assert pool.candidates() == ["http://c:1", "http://a:1", "http://b:1"]
    now[0] += 4.5  # a is back, b is not yet
    assert pool.candidates() == ["http://a:1", "http://c:1", "http://b:1"]
    pool.learn(["http://d:1", "http://a:1", "not a url", "ftp://e:1"])  # bad ones skipped
    assert pool.known == ["http://a:1", "http://b:1", "http://c:1", "http://d:1"]


def test_the_node_learns_the_live_instances(coordinator: InProcessCoordinator) -> None:
    pid, epoch = _ongoing(coordinator)

    async def check() -> None:
        pool = CoordinatorPool([coordinator.url], INTERNAL_TOKEN, timeout_s=2)
        try:
            await pool.refresh_members()
            assert coordinator.url in pool.known
            # configured with a dead instance only, but knowing the live one: still works
            dead = f"http://127.0.0.1:{free_port()}"
            learned = CoordinatorPool([dead], INTERNAL_TOKEN, timeout_s=2)
            learned.learn([coordinator.url])
            try:
                verified = await CoordinatorVerifier(learned).verify(pid, epoch, TP)
                assert verified.transactional_id == "pool"
            finally:
                await learned.close()
        finally:
            await pool.close()

    asyncio.run(check())
