"""The contract in sdk/protocol matches docs/design.md §3 and §4."""

from __future__ import annotations

import pytest

from sdk.protocol import errors
from sdk.protocol.errors import CATALOGUE, ErrorClass, error_for
from sdk.protocol.states import Outcome, TransactionState, TxnEvent, decide

S = TransactionState

DESIGN_CODES = {
    400: ["INVALID_REQUEST", "INVALID_TRANSACTION_TIMEOUT", "INVALID_RECORD"],
    401: ["UNAUTHENTICATED"],
    403: [
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
    ],
    404: ["UNKNOWN_TOPIC_OR_PARTITION", "TRANSACTIONAL_ID_NOT_FOUND", "UNKNOWN_PRODUCER_ID"],
    409: [
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "INVALID_PRODUCER_ID_MAPPING",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "TRANSACTION_COORDINATOR_FENCED",
        "TOPIC_ALREADY_EXISTS",
        "TRANSACTION_ABORTABLE",
    ],
    413: ["MESSAGE_TOO_LARGE"],
    503: [
        "NOT_COORDINATOR",
        "COORDINATOR_NOT_AVAILABLE",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "CONCURRENT_TRANSACTIONS",
        "NOT_LEADER_OR_FOLLOWER",
        "UNSTABLE_OFFSET_COMMIT",
        "KAFKA_STORAGE_ERROR",
    ],
}


@pytest.mark.parametrize(
    ("status", "code"), [(s, c) for s, codes in DESIGN_CODES.items() for c in codes]
)
def test_every_design_code_has_its_status(status: int, code: str) -> None:
    assert CATALOGUE[code].http_status == status
    assert CATALOGUE[code].retriable == (status == 503)


def test_classes_follow_kafka() -> None:
    fatal = {
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_PRODUCER_ID_MAPPING",
        "INVALID_TXN_STATE",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    }
    abortable = {
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "UNKNOWN_PRODUCER_ID",
        "TRANSACTION_ABORTABLE",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
    }
    for code in fatal:
        assert CATALOGUE[code].error_class is ErrorClass.FATAL, code
    for code in abortable:
        assert CATALOGUE[code].error_class is ErrorClass.ABORTABLE, code
    for spec in CATALOGUE.values():
        assert [spec.retriable, spec.abortable, spec.fatal].count(True) <= 1


def test_error_for_builds_the_right_class_and_envelope() -> None:
    error = error_for("PRODUCER_FENCED", "old epoch")
    assert isinstance(error, errors.ProducerFencedError)
    assert isinstance(error, errors.FatalError)
    assert error.envelope() == {
        "error": {"code": "PRODUCER_FENCED", "message": "old epoch", "retriable": False}
    }
    assert isinstance(error_for("SOMETHING_NEW"), errors.InternalError)


def test_stored_ids_are_stable_and_unique() -> None:
    ids = [state.stored_id for state in TransactionState]
    assert len(set(ids)) == len(ids)
    for state in TransactionState:
        assert TransactionState.from_stored_id(state.stored_id) is state


TABLE = [
    (S.EMPTY, TxnEvent.ADD, False, Outcome.TRANSITION, S.ONGOING),
    (S.EMPTY, TxnEvent.COMMIT, False, Outcome.INVALID, None),
    (S.EMPTY, TxnEvent.ABORT, False, Outcome.INVALID, None),
    (S.EMPTY, TxnEvent.INIT, False, Outcome.BUMP_EPOCH, S.EMPTY),
    (S.EMPTY, TxnEvent.TIMEOUT, False, Outcome.IGNORE, None),
    (S.COMPLETE_COMMIT, TxnEvent.ADD, False, Outcome.TRANSITION, S.ONGOING),
    (S.COMPLETE_COMMIT, TxnEvent.COMMIT, True, Outcome.RETRY_SUCCESS, S.COMPLETE_COMMIT),
    (S.COMPLETE_COMMIT, TxnEvent.ABORT, False, Outcome.INVALID, None),
    (S.COMPLETE_ABORT, TxnEvent.ABORT, True, Outcome.RETRY_SUCCESS, S.COMPLETE_ABORT),
    (S.COMPLETE_ABORT, TxnEvent.INIT, False, Outcome.BUMP_EPOCH, S.COMPLETE_ABORT),
    (S.ONGOING, TxnEvent.ADD, False, Outcome.STAY, S.ONGOING),
    (S.ONGOING, TxnEvent.COMMIT, False, Outcome.TRANSITION, S.PREPARE_COMMIT),
    (S.ONGOING, TxnEvent.ABORT, False, Outcome.TRANSITION, S.PREPARE_ABORT),
    (S.ONGOING, TxnEvent.INIT, False, Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT),
    (S.ONGOING, TxnEvent.TIMEOUT, False, Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, TxnEvent.ADD, False, Outcome.CONCURRENT, None),
    (S.PREPARE_COMMIT, TxnEvent.COMMIT, True, Outcome.RETRY_SUCCESS, S.PREPARE_COMMIT),
    (S.PREPARE_COMMIT, TxnEvent.ABORT, False, Outcome.INVALID, None),
    (S.PREPARE_COMMIT, TxnEvent.INIT, False, Outcome.CONCURRENT, None),
    (S.PREPARE_ABORT, TxnEvent.ABORT, True, Outcome.RETRY_SUCCESS, S.PREPARE_ABORT),
    (S.PREPARE_ABORT, TxnEvent.COMMIT, False, Outcome.INVALID, None),
    (S.DEAD, TxnEvent.ADD, False, Outcome.INVALID, None),
]


@pytest.mark.parametrize(("state", "event", "retry", "outcome", "target"), TABLE)
def test_transition_table(
    state: TransactionState,
    event: TxnEvent,
    retry: bool,
    outcome: Outcome,
    target: TransactionState | None,
) -> None:
    decision = decide(state, event, last_decision_matches=retry)
    assert decision.outcome is outcome
    assert decision.target is target


def test_every_transition_target_is_a_legal_successor() -> None:
    for state in TransactionState:
        for event in TxnEvent:
            for retry in (False, True):
                decision = decide(state, event, last_decision_matches=retry)
                if decision.outcome in (Outcome.TRANSITION, Outcome.FENCE_AND_ABORT):
                    assert decision.target is not None
                    assert state.can_transition_to(decision.target), (state, event)
