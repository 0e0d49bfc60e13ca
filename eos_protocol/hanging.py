"""Wire models of hanging-transaction detection (KIP-664), docs/design.md §4.

Three parties read them: a storage node answers ``OpenTransactionsResponse`` to the
coordinators (``GET /internal/v1/open-transactions``: the transactions open on every
partition it leads), the coordinator answers ``HangingTransactionsResponse`` to operators
and to the web console (``GET /v1/admin/hanging-transactions``) and takes
``AbortHangingRequest`` (``POST /v1/admin/hanging-transactions/abort``).

A transaction open on a partition is *hanging* when the coordinators cannot end it: they
do not know its producer, do not hold it as ongoing with that partition, or it has been
open longer than any transaction may run. ``HangingReason`` names which; the reasons are
part of the contract, a console shows them as they are.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from eos_protocol.common import (
    AnswerModel,
    Offset,
    PartitionIndex,
    ProducerEpoch,
    ProducerId,
    TopicName,
    WireModel,
    examples,
)


class HangingReason(StrEnum):
    """Why an open transaction is hanging."""

    UNKNOWN_PRODUCER = "unknown_producer"
    """No transactional id holds this producer id: never issued, or its state was lost."""
    NOT_ONGOING_AT_COORDINATOR = "not_ongoing_at_coordinator"
    """The producer's transactional id is not Ongoing (nor preparing) at this epoch: a lost
    marker, a zombie of an older epoch."""
    PARTITION_NOT_ADDED = "partition_not_added"
    """The transaction is Ongoing, but this partition was never added to it."""
    OLDER_THAN_MAX_TIMEOUT = "older_than_max_timeout"
    """Open for longer than the maximum transaction timeout plus the margin."""


class OpenTransaction(AnswerModel):
    """One producer's open transaction on one partition a node leads."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int = Field(
        description="The newest coordinator epoch whose marker this producer has here "
        "(-1: none); a marker needs at least this one."
    )
    first_offset: int = Field(description="Offset of the transaction's first batch here.")
    age_ms: int = Field(description="Milliseconds since that batch was appended.")


class OpenTransactionsResponse(AnswerModel):
    """A node's open transactions, over every partition it leads."""

    model_config = examples(
        {
            "node_id": 1,
            "now_ms": 1795322141308,
            "open_transactions": [
                {
                    "topic": "orders",
                    "partition": 0,
                    "producer_id": 4242,
                    "producer_epoch": 0,
                    "coordinator_epoch": -1,
                    "first_offset": 17,
                    "age_ms": 912000,
                }
            ],
        }
    )

    node_id: int
    now_ms: int = Field(description="The node's clock when it answered.")
    open_transactions: list[OpenTransaction]


class HangingTransaction(AnswerModel):
    """One hanging transaction on one partition."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_offset: int
    age_ms: int
    reason: HangingReason
    transactional_id: str | None = Field(
        description="The transactional id holding this producer id, if any."
    )
    coordinator_state: str | None = Field(
        description="That id's state at the coordinator (e.g. CompleteCommit), if any."
    )


class HangingTransactionsResponse(AnswerModel):
    """What a detection pass found, over every node."""

    model_config = examples(
        {
            "checked_at_ms": 1795322141308,
            "open_on_nodes": 3,
            "hanging": [
                {
                    "topic": "orders",
                    "partition": 0,
                    "producer_id": 4242,
                    "producer_epoch": 0,
                    "first_offset": 17,
                    "age_ms": 912000,
                    "reason": "unknown_producer",
                    "transactional_id": None,
                    "coordinator_state": None,
                }
            ],
        }
    )

    checked_at_ms: int = Field(description="When the nodes were asked (coordinator clock).")
    open_on_nodes: int = Field(
        description="Open transactions found on the nodes' partitions, hanging or not."
    )
    hanging: list[HangingTransaction]


class AbortHangingRequest(WireModel):
    """Abort one hanging transaction: the partition and the producer open on it."""

    model_config = examples(
        {"topic": "orders", "partition": 0, "producer_id": 4242, "producer_epoch": 0}
    )

    topic: TopicName
    partition: PartitionIndex
    producer_id: ProducerId
    producer_epoch: ProducerEpoch


class AbortHangingResponse(AnswerModel):
    """The abort marker written: its epoch (the open one's, bumped) and where."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int = Field(description="The epoch of the aborted transaction.")
    marker_epoch: int = Field(
        description="The epoch the abort marker carried (one above, unless at the top): "
        "later batches of the old epoch are fenced on that partition."
    )
    first_offset: Offset
    leader: int = Field(description="The node that leads the partition and wrote it.")


__all__ = [
    "AbortHangingRequest",
    "AbortHangingResponse",
    "HangingReason",
    "HangingTransaction",
    "HangingTransactionsResponse",
    "OpenTransaction",
    "OpenTransactionsResponse",
]
