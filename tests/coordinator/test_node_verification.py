"""A storage node's KIP-890 verifier (partition_service/verification.py) against a real
in-process coordinator, over its keep-alive HTTP/1.1 client: every answer of the
coordinator maps to the error the node must give, and a coordinator that goes away is
COORDINATOR_NOT_AVAILABLE."""

from __future__ import annotations

import asyncio

import pytest

from partition_service.verification import CoordinatorVerifier
from sdk.protocol.common import TopicPartition
from sdk.protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
)
from tests.coordinator.helpers import add, init, ok, topic
from tests.support.coordinators import INTERNAL_TOKEN, InProcessCoordinator
from tests.support.processes import free_port


def test_verifier_answers(coordinator: InProcessCoordinator) -> None:
    with coordinator.client() as client:
        topic(client)
        pid, epoch = init(client, "v")
        ok(add(client, "v", pid, epoch, 1))

    async def check() -> None:
        verifier = CoordinatorVerifier(coordinator.url, INTERNAL_TOKEN)
        assert verifier._fast is not None  # the keep-alive client, not httpx
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
            wrong = CoordinatorVerifier(coordinator.url, "not-the-token")
            with pytest.raises(CoordinatorNotAvailableError):  # 401
                await wrong.verify(pid, epoch, TopicPartition(topic="orders", partition=1))
            await wrong.close()
            gone = CoordinatorVerifier(f"http://127.0.0.1:{free_port()}", INTERNAL_TOKEN)
            with pytest.raises(CoordinatorNotAvailableError):
                await gone.verify(pid, epoch, TopicPartition(topic="orders", partition=1))
            await gone.close()
        finally:
            await verifier.close()

    asyncio.run(check())
