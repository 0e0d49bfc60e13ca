"""KIP-890 verification: a transactional batch may only open a transaction on a partition
that the coordinator has added to that producer's transaction.

Without it, a late batch of a producer whose transaction has already ended would open a
new, never-ending transaction here and hold back the LSO forever. The node asks the
coordinator (any instance answers from the shared store; add-partitions is durable before
it is acknowledged), and only when the batch would open a transaction: later batches of the
same transaction, at the same epoch, need no second question.
"""

from __future__ import annotations

import logging
from typing import Protocol

import httpx

from sdk.protocol.common import TopicPartition
from sdk.protocol.coordinator import ProducerTransactionView
from sdk.protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
)
from sdk.protocol.server import internal_headers
from sdk.protocol.states import TransactionState

log = logging.getLogger("eos.node.verification")


class TransactionVerifier(Protocol):
    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        """Raise unless the producer's current transaction includes ``tp``."""

    async def close(self) -> None: ...


class TrustingVerifier:
    """For a node run without a coordinator (tests of the node alone): accepts every batch."""

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        return None

    async def close(self) -> None:
        return None


class CoordinatorVerifier:
    """Asks the coordinator's internal producer view."""

    def __init__(
        self,
        coordinator_url: str | None,
        internal_token: str | None,
        *,
        timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.coordinator_url = coordinator_url.rstrip("/") if coordinator_url else None
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, headers=internal_headers(internal_token)
        )

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        if self.coordinator_url is None:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL, so it cannot verify transactional batches"
            )
        url = f"{self.coordinator_url}/internal/v1/producers/{producer_id}/transaction"
        try:
            response = await self._client.get(url)
        except httpx.HTTPError as exc:
            raise CoordinatorNotAvailableError(f"coordinator unreachable: {exc}") from exc
        if response.status_code == 404:
            raise TransactionAbortableError(
                f"producer {producer_id} has no transaction at the coordinator"
            )
        if response.status_code != 200:
            raise CoordinatorNotAvailableError(
                f"coordinator answered {response.status_code} to the verification"
            )
        view = ProducerTransactionView.model_validate_json(response.content)
        if view.producer_epoch > producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} was fenced by epoch "
                f"{view.producer_epoch}"
            )
        if view.producer_epoch < producer_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {producer_epoch} is ahead of the coordinator's "
                f"{view.producer_epoch}"
            )
        if view.state is not TransactionState.ONGOING or tp not in view.partitions:
            raise TransactionAbortableError(
                f"{tp.topic}-{tp.partition} was not added to the transaction of producer "
                f"{producer_id} (state {view.state.value})"
            )

    async def close(self) -> None:
        await self._client.aclose()
