"""The coordinator's transition table (docs/design.md §3) as pure functions.

``decide`` is the whole table: for a transactional id's state and what happens to it
(add, commit, abort, init, timeout), the kind of answer and the state that follows. The
lifecycle and its tests share this one definition of what is legal; ``can_transition``
is the looser check every write of a record obeys (Kafka's ``validPreviousStates``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from eos_protocol.states import TransactionState

S = TransactionState

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


def can_transition(source: TransactionState, target: TransactionState) -> bool:
    """Whether a record in ``source`` may be followed by one in ``target``."""
    return source in _VALID_PREVIOUS[target]


def may_expire(state: TransactionState) -> bool:
    """Whether an idle transactional id in this state may be removed."""
    return state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)


def starts_new_transaction(state: TransactionState) -> bool:
    """Whether the next add-partitions in this state opens a new transaction."""
    return state is S.EMPTY or state.is_complete


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
        if starts_new_transaction(state):
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
