"""KIP-890 verification: a transactional batch may only open a transaction on a partition
that the coordinator has added to that producer's transaction.

Without it, a late batch of a producer whose transaction has already ended would open a
new, never-ending transaction here and hold back the LSO forever. The node asks the
coordinator (any instance answers from the shared store; add-partitions is durable before
it is acknowledged), and only when the batch would open a transaction: later batches of the
same transaction, at the same epoch, need no second question.

The question is one small GET per transaction and partition, so its cost shows in every
transactional produce. httpx's connection pool checks every idle connection of the pool
for staleness on each request, which with a few dozen concurrent producers cost the node
more CPU than the append itself; a plain ``http://`` coordinator is therefore asked over
the services' shared keep-alive HTTP/1.1 client (``sdk/protocol/keepalive.py``). An
``https://`` coordinator, or an ``httpx`` client handed in, still goes through httpx.
"""

from __future__ import annotations

import logging
import ssl
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
from sdk.protocol.keepalive import KeepAliveClient
from sdk.protocol.server import internal_headers
from sdk.protocol.states import TransactionState

log = logging.getLogger("eos.node.verification")


class TransactionVerifier(Protocol):
    async def verify(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> str | None:
        """Raise unless the producer's current transaction includes ``tp``; answer the
        transactional id it belongs to (None when not known), for the ACL check."""

    async def close(self) -> None: ...


class TrustingVerifier:
    """For a node run without a coordinator (tests of the node alone): accepts every batch."""

    async def verify(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> str | None:
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
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.coordinator_url = coordinator_url.rstrip("/") if coordinator_url else None
        self._headers = {**internal_headers(internal_token), "accept": "application/json"}
        self._fast: KeepAliveClient | None = None
        if (
            client is None
            and self.coordinator_url is not None
            and KeepAliveClient.supports(self.coordinator_url)
        ):
            # one connection per concurrent verification, kept for the next ones
            self._fast = KeepAliveClient(timeout_s=timeout_s, max_idle_per_host=64)
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, headers=internal_headers(internal_token), verify=verify
        )

    async def _ask(self, producer_id: int) -> tuple[int, bytes]:
        url = f"{self.coordinator_url}/internal/v1/producers/{producer_id}/transaction"
        try:
            if self._fast is not None:
                return await self._fast.request("GET", url, headers=self._headers)
            response = await self._client.get(url)
        except httpx.HTTPError as exc:
            raise CoordinatorNotAvailableError(
                f"coordinator unreachable: {exc or type(exc).__name__}"
            ) from exc
        return response.status_code, response.content

    async def verify(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> str | None:
        if self.coordinator_url is None:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL, so it cannot verify transactional batches"
            )
        status, content = await self._ask(producer_id)
        if status == 404:
            raise TransactionAbortableError(
                f"producer {producer_id} has no transaction at the coordinator"
            )
        if status != 200:
            raise CoordinatorNotAvailableError(
                f"coordinator answered {status} to the verification"
            )
        view = ProducerTransactionView.model_validate_json(content)
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
        return view.transactional_id

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        await self._client.aclose()
