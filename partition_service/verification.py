"""KIP-890 verification: a transactional batch may only open a transaction on a partition
that the coordinator has added to that producer's transaction.

Without it, a late batch of a producer whose transaction has already ended would open a
new, never-ending transaction here and hold back the LSO forever. The node asks a
coordinator (any instance answers from the shared store; add-partitions is durable before
it is acknowledged), and only when the batch would open a transaction: later batches of the
same transaction, at the same epoch, need no second question.

Which instance is asked, and falling over to another when it does not answer, is the
``CoordinatorPool``'s business (``partition_service/coordinators.py``): the loss of any
one coordinator, the one the node was started with included, does not stop transactions.
"""

from __future__ import annotations

import logging
from typing import Protocol

from eos_protocol.common import TopicPartition, read_answer_json
from eos_protocol.coordinator import ProducerTransactionView
from eos_protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
)
from eos_protocol.paths import segment
from eos_protocol.states import TransactionState
from partition_service.coordinators import CoordinatorPool

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
    """Asks the coordinators' internal producer view, through the pool."""

    def __init__(self, pool: CoordinatorPool) -> None:
        self.pool = pool

    async def verify(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> str | None:
        status, content = await self.pool.get(
            f"/internal/v1/producers/{segment(producer_id)}/transaction"
        )
        if status == 404:
            raise TransactionAbortableError(
                f"producer {producer_id} has no transaction at the coordinator"
            )
        if status != 200:
            raise CoordinatorNotAvailableError(
                f"coordinator answered {status} to the verification"
            )
        view = read_answer_json(ProducerTransactionView, content)
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
        return None  # the pool belongs to the app
