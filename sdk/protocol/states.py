"""Transaction states of the coordinator and their transition table (docs/design.md §3).

Kafka's ``TransactionState`` is the model: every state has a stable id (the value stored in
the database), the set of states it may be entered from and whether an idle transactional
id in that state may expire. ``decide`` is the whole table of §3 as a pure function, so the
coordinator, its tests and any reader share one definition of what is legal.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    def stored_id(self) -> int:
        """The stable small integer kept in the transaction log."""
        return _STORED_IDS[self]

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        return _VALID_PREVIOUS[self]

    @property
    def expiration_allowed(self) -> bool:
        """Whether an idle transactional id in this state may be removed."""
        return self in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        )

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @property
    def accepts_new_transaction(self) -> bool:
        """States from which the next add-partitions starts a transaction."""
        return self is TransactionState.EMPTY or self.is_complete

    def can_transition_to(self, target: TransactionState) -> bool:
        return self in target.valid_previous_states

    @classmethod
    def from_stored_id(cls, stored: int) -> TransactionState:
        return _FROM_STORED[stored]


S = TransactionState

_STORED_IDS: dict[TransactionState, int] = {
    S.EMPTY: 0,
    S.ONGOING: 1,
    S.PREPARE_COMMIT: 2,
    S.PREPARE_ABORT: 3,
    S.COMPLETE_COMMIT: 4,
    S.COMPLETE_ABORT: 5,
    S.DEAD: 6,
    S.PREPARE_EPOCH_FENCE: 7,
}
_FROM_STORED = {v: k for k, v in _STORED_IDS.items()}

_VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}


class TxnEvent(StrEnum):
    """What can happen to a transactional id (the columns of the table in §3)."""

    ADD = "add"  # add partitions or add offsets
    COMMIT = "commit"
    ABORT = "abort"
    INIT = "init"  # init_transactions with the same transactional id
    TIMEOUT = "timeout"


class Outcome(StrEnum):
    """The kind of answer the table gives."""

    TRANSITION = "transition"  # move to ``target``
    STAY = "stay"  # nothing changes (an add to an Ongoing transaction)
    RETRY_SUCCESS = "retry_success"  # a repeated decision: answer success, change nothing
    BUMP_EPOCH = "bump_epoch"  # init on an idle id: epoch + 1, state stays
    FENCE_AND_ABORT = "fence_and_abort"  # epoch + 1, then abort the open transaction
    CONCURRENT = "concurrent"  # CONCURRENT_TRANSACTIONS (retriable)
    INVALID = "invalid"  # INVALID_TXN_STATE
    IGNORE = "ignore"  # nothing to do (a timeout of an idle id)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    target: TransactionState | None = None


def decide(state: TransactionState, event: TxnEvent, *, last_decision_matches: bool) -> Decision:
    """Apply the table of docs/design.md §3.

    ``last_decision_matches`` says whether a commit/abort repeats the decision already taken
    for this transaction at the same epoch (a retry); it only matters in Prepare* and
    Complete* states.
    """
    if state is S.DEAD:
        return Decision(Outcome.INVALID)
    if event is TxnEvent.INIT:
        if state.is_prepare or state is S.PREPARE_EPOCH_FENCE:
            return Decision(Outcome.CONCURRENT)
        if state is S.ONGOING:
            return Decision(Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT)
        return Decision(Outcome.BUMP_EPOCH, state)
    if event is TxnEvent.TIMEOUT:
        if state is S.ONGOING:
            return Decision(Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT)
        return Decision(Outcome.IGNORE)
    if event is TxnEvent.ADD:
        if state.accepts_new_transaction:
            return Decision(Outcome.TRANSITION, S.ONGOING)
        if state is S.ONGOING:
            return Decision(Outcome.STAY, S.ONGOING)
        return Decision(Outcome.CONCURRENT)
    # commit or abort
    if state is S.ONGOING:
        return Decision(
            Outcome.TRANSITION,
            S.PREPARE_COMMIT if event is TxnEvent.COMMIT else S.PREPARE_ABORT,
        )
    if state is S.PREPARE_EPOCH_FENCE:
        return Decision(Outcome.CONCURRENT)
    if (state.is_prepare or state.is_complete) and last_decision_matches:
        return Decision(Outcome.RETRY_SUCCESS, state)
    return Decision(Outcome.INVALID)


def decision_of(state: TransactionState) -> TxnEvent | None:
    """The commit/abort decision a Prepare*/Complete* state records, if any."""
    if state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT):
        return TxnEvent.COMMIT
    if state in (S.PREPARE_ABORT, S.COMPLETE_ABORT):
        return TxnEvent.ABORT
    return None
