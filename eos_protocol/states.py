"""Transaction states as the wire carries them (docs/design.md §3).

Kafka's ``TransactionState`` is the model. The rules of which state follows which (the
table of §3) belong to the coordinator (``coordinator_service/transactions/table.py``);
clients only read these names in ``describe_transactions`` answers.
"""

from __future__ import annotations

from enum import StrEnum


class TransactionState(StrEnum):
    """A transactional id's state. The value is what the wire and the database carry."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"

    @property
    def is_prepare(self) -> bool:
        """A decision is taken and its markers are being written."""
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        """The last transaction ended and every marker is written."""
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)
