"""A storage node's KIP-890 verifier (partition_service/verification.py) against a real
in-process coordinator, over its keep-alive HTTP/1.1 client: every answer of the
coordinator maps to the error the node must give, and a coordinator that goes away is
COORDINATOR_NOT_AVAILABLE."""

from __future__ import annotations

import asyncio

import pytest

from eos_protocol.common import TopicPartition
from eos_protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
)
from partition_service.coordinators import CoordinatorPool
from partition_service.verification import CoordinatorVerifier
from tests.coordinator.helpers import add, init, ok, topic
from tests.support.coordinators import INTERNAL_TOKEN, InProcessCoordinator
from tests.support.processes import free_port


def _verifier(
    *urls: str, token: str = INTERNAL_TOKEN, timeout_s: float = 5.0
) -> CoordinatorVerifier:
    return CoordinatorVerifier(CoordinatorPool(list(urls), token, timeout_s=timeout_s))


def test_verifier_answers(coordinator: InProcessCoordinator) -> None:
    with coordinator.client() as client:
        topic(client)
        pid, epoch = init(client, "v")
        ok(add(client, "v", pid, epoch, 1))

    async def check() -> None:
        verifier = _verifier(coordinator.url)
        assert verifier.pool._fast is not None  # the keep-alive client, not httpx
        try:
            for _ in range(3):  # the same connection, reused
                await verifier.verify(pid, epoch, TopicPartition(topic="orders", partition=1))
            with pytest.raises(TransactionAbortableError):
                await verifier.verify(pid, epoch, TopicPartition(topic="orders", partition=2))
            with pytest.raises(ProducerFencedError):
                await verifier.verify(pid, epoch - 1 if epoch else -1,
                                      TopicPartition(topic="orders", partition=1))
            with pytest.raises(InvalidProducerEpochError):
                await verifier.verify(pid, epoch + 1, TopicPartition(topic="orders", partition=1))
            with pytest.raises(TransactionAbortableError):  # unknown producer id: 404
                await verifier.verify(pid + 9999, 0, TopicPartition(topic="orders", partition=1))
            wrong = _verifier(coordinator.url, token="not-the-token")
            with pytest.raises(CoordinatorNotAvailableError):  # 401
                await wrong.verify(pid, epoch, TopicPartition(topic="orders", partition=1))
            await wrong.pool.close()
            gone = _verifier(f"http://127.0.0.1:{free_port()}")
            with pytest.raises(CoordinatorNotAvailableError):
                await gone.verify(pid, epoch, TopicPartition(topic="orders", partition=1))
            await gone.pool.close()
        finally:
            await verifier.pool.close()

    asyncio.run(check())
