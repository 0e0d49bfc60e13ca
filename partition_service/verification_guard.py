"""Verification guards (KIP-890 part 1): a verified batch is appended only if no marker
for its producer was written here while the verification was under way.

A transactional batch that would open a transaction on a partition is first verified with
the coordinator (``verification.py``): an await of a round trip. Meanwhile the transaction
can end — a client's abort, a timeout — and its marker can reach this partition before
the batch does. Appended after that marker, the batch would open a transaction that no
coordinator will ever end (a hanging transaction, holding the last stable offset back
until the detector aborts it). A fencing marker bumps the epoch here and so refuses the
batch anyway, and under transaction version 2 every end bumps it; an end that keeps the
epoch (transaction version 1) does not, and only there is the guard consulted. Kafka keeps a
verification guard in the producer's state for this; here it is kept per partition and
per producer while verifications are in flight, and every marker for the producer spoils
it. A batch whose guard was spoiled is refused ``TRANSACTION_ABORTABLE``: its transaction
is over, and the client aborts and begins again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from eos_protocol.errors import TransactionAbortableError
from eos_protocol.versions import TRANSACTION_VERSION_2


@dataclass
class _Guard:
    users: int = 0
    spoiled: bool = False


class VerificationGuards:
    """The verifications in flight on one partition, by producer id. Holds an entry only
    while a verification of that producer is under way, so it stays as small as the
    number of verifications in flight."""

    def __init__(self) -> None:
        self._open: dict[int, _Guard] = {}

    @contextmanager
    def guard(self, producer_id: int) -> Iterator[_Guard]:
        """Hold a guard for ``producer_id`` across its verification; ``check`` it in the
        same step of the event loop as the append."""
        guard = self._open.get(producer_id)
        if guard is None:
            guard = self._open[producer_id] = _Guard()
        guard.users += 1
        try:
            yield guard
        finally:
            guard.users -= 1
            if guard.users == 0 and self._open.get(producer_id) is guard:
                del self._open[producer_id]

    def invalidate(self, producer_id: int) -> None:
        """A marker for ``producer_id`` is being written: its verifications under way no
        longer vouch for their batches."""
        guard = self._open.pop(producer_id, None)
        if guard is not None:
            guard.spoiled = True

    @staticmethod
    def check(guard: _Guard, producer_id: int, transaction_version: int = 1) -> None:
        """Refuse the batch if its guard was spoiled — under transaction version 1 only.
        Under version 2 the marker of the transaction before it comes with the epoch the
        batch already carries (the end bumped it), and may well land while the batch's
        own add waits for that end to complete: a spoiled guard means nothing there, and
        a late batch of an ended transaction is fenced by its epoch instead."""
        if guard.spoiled and transaction_version < TRANSACTION_VERSION_2:
            raise TransactionAbortableError(
                f"the transaction of producer {producer_id} ended here while its batch "
                "was being verified; abort and begin a new one"
            )

    def __len__(self) -> int:
        return len(self._open)
