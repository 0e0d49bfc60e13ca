"""KIP-890 verification: a transactional batch may only open a transaction on a partition
that the coordinator has added to that producer's transaction.

Without it, a late batch of a producer whose transaction has already ended would open a
new, never-ending transaction here and hold back the LSO forever. The node asks a
coordinator (any instance answers from the shared store; add-partitions is durable before
it is acknowledged), and only when the batch would open a transaction: later batches of the
same transaction, at the same epoch, need no second question.

Under transaction version 2 (KIP-890 part 2) the client sends no add-partitions: the node
adds the partition itself, with ``POST /internal/v1/producers/{id}/partitions`` to the
owner of the producer's transactional id, and appends once the add is durable. Which
flow a producer uses is in its coordinator record: the GET answer names it, and the node
remembers it per producer id, so a version-2 producer's later first batches go straight
to the add (and to the instance that owned it last time). The add answers the record as
the GET does, and the same checks follow: the epoch must be the current one (a late
batch of a transaction that ended, at the epoch its end bumped, is fenced here and opens
nothing), and the transaction must be Ongoing with the partition in it.

Which instance is asked, and falling over to another when it does not answer, is the
``CoordinatorPool``'s business (``partition_service/coordinators.py``): the loss of any
one coordinator, the one the node was started with included, does not stop transactions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import orjson

from eos_protocol.common import TopicPartition, read_answer_json
from eos_protocol.coordinator import (
    TRANSACTION_VERSION_1,
    TRANSACTION_VERSION_2,
    ProducerTransactionView,
)
from eos_protocol.errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    EosError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
    error_for,
)
from eos_protocol.paths import segment
from eos_protocol.states import TransactionState
from partition_service.coordinators import CoordinatorPool

log = logging.getLogger("eos.node.verification")


@dataclass(frozen=True)
class Verified:
    """What a verification learned of the batch's transaction."""

    #: the transactional id it belongs to (None when not known), for the ACL check
    transactional_id: str | None
    #: under transaction version 2 every end bumps the epoch, so a late batch of an ended
    #: transaction is fenced by its epoch; under version 1 only the verification guard
    #: (``verification_guard.py``) keeps it out
    transaction_version: int = TRANSACTION_VERSION_1


class TransactionVerifier(Protocol):
    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> Verified:
        """Raise unless the producer's current transaction includes ``tp``."""

    async def close(self) -> None: ...


class TrustingVerifier:
    """For a node run without a coordinator (tests of the node alone): accepts every batch."""

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> Verified:
        return Verified(None)

    async def close(self) -> None:
        return None


#: Errors of the add that the producer gets as they are: they say what became of its
#: batch (fenced, a stale epoch, a transaction still completing). Any other refusal is
#: the coordinator's trouble, not the batch's: COORDINATOR_NOT_AVAILABLE, to retry.
_PASSED_ON = frozenset(
    {
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "CONCURRENT_TRANSACTIONS",
        "INVALID_TXN_STATE",
        "UNKNOWN_TOPIC_OR_PARTITION",
    }
)

#: Refusals that mean the producer id has no transaction to join (as the GET's 404).
_NO_TRANSACTION = frozenset({"UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_ID_MAPPING"})

#: How many producers' flows (and owners) a node remembers; the oldest go first.
REMEMBERED_PRODUCERS = 10_000


class CoordinatorVerifier:
    """Asks the coordinators' internal producer view, through the pool; for producers
    of transaction version 2 it adds the partition instead."""

    def __init__(self, pool: CoordinatorPool) -> None:
        self.pool = pool
        # producer id -> the instance that added for it last (version-2 producers only)
        self._adders: dict[int, str] = {}

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> Verified:
        if producer_id in self._adders:
            view = await self._add(producer_id, producer_epoch, tp)
        else:
            view = await self._view(producer_id)
            if _needs_add(view, producer_id, producer_epoch, tp):
                view = await self._add(producer_id, producer_epoch, tp)
        _check(view, producer_id, producer_epoch, tp)
        return Verified(view.transactional_id, view.transaction_version)

    async def _view(self, producer_id: int) -> ProducerTransactionView:
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
        return read_answer_json(ProducerTransactionView, content)

    async def _add(
        self, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> ProducerTransactionView:
        """Add ``tp`` at the owner of the producer's transactional id (version 2)."""
        status, content, owner = await self.pool.post_to_owner(
            f"/internal/v1/producers/{segment(producer_id)}/partitions",
            {"producer_epoch": producer_epoch, "topic": tp.topic, "partition": tp.partition},
            first=self._adders.get(producer_id),
        )
        if status == 200:
            view = read_answer_json(ProducerTransactionView, content)
            self._remember(producer_id, owner, view)
            return view
        self._adders.pop(producer_id, None)
        error = _envelope_error(content)
        if error is not None and error.code in _NO_TRANSACTION:
            raise TransactionAbortableError(
                f"producer {producer_id} has no transaction at the coordinator"
            )
        if error is not None and error.code in _PASSED_ON:
            raise error
        raise CoordinatorNotAvailableError(
            f"coordinator answered {status} to adding {tp.topic}-{tp.partition}"
            + (f" ({error.code}: {error})" if error is not None else "")
        )

    def _remember(self, producer_id: int, owner: str, view: ProducerTransactionView) -> None:
        if view.transaction_version < TRANSACTION_VERSION_2:
            self._adders.pop(producer_id, None)  # back to the old flow: verify only
            return
        self._adders.pop(producer_id, None)
        self._adders[producer_id] = owner  # most recent last
        while len(self._adders) > REMEMBERED_PRODUCERS:
            del self._adders[next(iter(self._adders))]

    async def close(self) -> None:
        return None  # the pool belongs to the app


def _needs_add(
    view: ProducerTransactionView, producer_id: int, producer_epoch: int, tp: TopicPartition
) -> bool:
    """Whether a batch must add ``tp`` first: a version-2 producer at its current id and
    epoch (else ``_check`` refuses it) whose open transaction, if any, lacks ``tp``."""
    return (
        view.transaction_version >= TRANSACTION_VERSION_2
        and (view.producer_id, view.producer_epoch) == (producer_id, producer_epoch)
        and (view.state is not TransactionState.ONGOING or tp not in view.partitions)
    )


def _envelope_error(content: bytes) -> EosError | None:
    try:
        body = orjson.loads(content)["error"]
        return error_for(str(body["code"]), str(body.get("message", "")))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def _check(
    view: ProducerTransactionView, producer_id: int, producer_epoch: int, tp: TopicPartition
) -> None:
    """Refuse the batch unless the producer's current transaction, at its epoch, holds
    ``tp`` (what the verification GET or the add answered)."""
    if view.producer_id != producer_id:
        # the record hands this id out once its previous transaction completes (a
        # version-2 end that exhausted the epoch of the id before it)
        raise ConcurrentTransactionsError(
            f"producer {producer_id} takes over its transactional id once the previous "
            "transaction completes"
        )
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
