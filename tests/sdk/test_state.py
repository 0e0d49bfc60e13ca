"""The client state machine on its own: no server, no I/O."""

from __future__ import annotations

import pytest

from sdk import (
    DeliveryTimeoutError,
    IllegalStateError,
    InvalidTxnStateError,
    OutOfOrderSequenceNumberError,
    ProducerFencedError,
    ProducerState,
    TopicPartition,
    TransactionAbortableError,
)
from sdk._state import TransactionManager, breaks_sequence

pytestmark = pytest.mark.unit

S = ProducerState
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def state(txn: TransactionManager) -> ProducerState:
    """The current state, read through a call so that mypy does not narrow it for good."""
    return txn.state


def ready() -> TransactionManager:
    txn = TransactionManager("tid")
    txn.begin_init()
    txn.complete_init(7, 0)
    return txn


def in_transaction() -> TransactionManager:
    txn = ready()
    txn.begin_transaction()
    return txn


def test_happy_path_of_a_transaction() -> None:
    txn = TransactionManager("tid")
    assert txn.state is S.UNINITIALIZED
    txn.begin_init()
    assert state(txn) is S.INITIALIZING
    txn.complete_init(7, 3)
    assert (txn.state, txn.producer_id, txn.producer_epoch) == (S.READY, 7, 3)
    txn.begin_transaction()
    assert state(txn) is S.IN_TRANSACTION
    txn.ensure_can_send()
    txn.begin_commit()
    assert state(txn) is S.COMMITTING_TRANSACTION
    txn.complete_end()
    assert state(txn) is S.READY


@pytest.mark.parametrize(
    "call",
    ["begin_transaction", "begin_commit", "begin_abort", "ensure_can_send",
     "ensure_can_add_offsets"],
)
def test_calls_before_init_are_refused(call: str) -> None:
    txn = TransactionManager("tid")
    with pytest.raises(IllegalStateError):
        getattr(txn, call)()


def test_out_of_order_calls_in_ready_and_in_transaction() -> None:
    txn = ready()
    for call in (txn.begin_commit, txn.begin_abort, txn.ensure_can_send, txn.begin_init):
        with pytest.raises(IllegalStateError):
            call()
    txn.begin_transaction()
    with pytest.raises(IllegalStateError):
        txn.begin_transaction()
    with pytest.raises(IllegalStateError):
        txn.begin_init()


def test_commit_may_be_retried_but_not_aborted_midway() -> None:
    txn = in_transaction()
    txn.begin_commit()
    txn.begin_commit()  # a retry after a timeout
    with pytest.raises(IllegalStateError):
        txn.begin_abort()
    with pytest.raises(IllegalStateError):
        txn.ensure_can_send()


def test_abortable_error_allows_only_abort() -> None:
    txn = in_transaction()
    txn.on_error(TransactionAbortableError("partition not added"))
    assert txn.state is S.ABORTABLE_ERROR
    for call in (txn.ensure_can_send, txn.begin_commit, txn.ensure_can_add_offsets):
        with pytest.raises(TransactionAbortableError):
            call()
    txn.begin_abort()
    txn.complete_end()
    assert state(txn) is S.READY and txn.last_error is None


def test_fatal_error_refuses_everything_with_the_cause() -> None:
    txn = in_transaction()
    txn.on_error(ProducerFencedError("newer epoch"))
    assert txn.state is S.FATAL_ERROR
    for call in (txn.begin_transaction, txn.begin_commit, txn.begin_abort,
                 txn.ensure_can_send, txn.begin_init):
        with pytest.raises(ProducerFencedError):
            call()


def test_fatal_codes_are_fatal_even_mid_commit() -> None:
    txn = in_transaction()
    txn.begin_commit()
    txn.on_error(InvalidTxnStateError("refused"))
    assert txn.state is S.FATAL_ERROR


@pytest.mark.parametrize(
    "error",
    [OutOfOrderSequenceNumberError("gap"), DeliveryTimeoutError("late")],
)
def test_sequence_errors_bump_the_epoch_after_the_abort(error: Exception) -> None:
    """KIP-360: abort, then INITIALIZING (init with the current id and epoch), then READY."""
    assert breaks_sequence(error)
    txn = in_transaction()
    txn.on_error(error)
    assert txn.state is S.ABORTABLE_ERROR and txn.epoch_bump_required
    txn.begin_abort()
    txn.complete_end()
    assert state(txn) is S.INITIALIZING
    txn.complete_init(7, 1)
    assert state(txn) is S.READY and not txn.epoch_bump_required


def test_partitions_are_added_once_in_one_batched_call() -> None:
    txn = in_transaction()
    for tp in (TP1, TP0, TP1):
        txn.maybe_add_partition(tp)
    assert not txn.is_sendable(TP0) and txn.in_flight_limit(TP0, 5) == 0
    first = txn.partitions_to_add()
    assert first == [TP0, TP1]
    assert txn.started_at_coordinator
    txn.maybe_add_partition(TopicPartition("t", 2))
    assert txn.partitions_to_add() == []  # one call at a time
    txn.on_partitions_added(first)
    assert txn.is_sendable(TP0) and txn.is_sendable(TP1)
    assert txn.in_flight_limit(TP0, 5) == 1  # the first batch opens the transaction alone
    txn.on_batch_acked(TP0)
    assert txn.in_flight_limit(TP0, 5) == 5 and txn.in_flight_limit(TP1, 5) == 1
    assert txn.partitions_to_add() == [TopicPartition("t", 2)]
    txn.maybe_add_partition(TP0)
    assert txn.pending == set()


def test_a_new_transaction_forgets_the_previous_partitions() -> None:
    txn = in_transaction()
    txn.maybe_add_partition(TP0)
    txn.on_partitions_added(txn.partitions_to_add())
    txn.on_offsets_added("g")
    txn.begin_commit()
    assert txn.needs_end_call
    txn.complete_end()
    txn.begin_transaction()
    assert not txn.needs_end_call and not txn.is_sendable(TP0) and not txn.groups


def test_an_empty_transaction_needs_no_end_call() -> None:
    txn = in_transaction()
    txn.begin_commit()
    assert not txn.needs_end_call


def test_no_adds_while_aborting() -> None:
    txn = in_transaction()
    txn.maybe_add_partition(TP0)
    txn.begin_abort()
    assert txn.partitions_to_add() == []


def test_idempotent_producer_has_no_transactions() -> None:
    txn = TransactionManager(None)
    txn.ensure_can_send()  # no id yet: the sender fetches one first
    for call in (txn.begin_transaction, txn.begin_commit, txn.begin_abort):
        with pytest.raises(IllegalStateError):
            call()
    txn.maybe_add_partition(TP0)
    assert txn.is_sendable(TP0) and not txn.pending
    txn.on_error(OutOfOrderSequenceNumberError("gap"))
    assert txn.state is S.UNINITIALIZED  # not a transaction: nothing to abort


def test_partitions_pending_during_an_add_join_its_retry() -> None:
    """An add retried after CONCURRENT_TRANSACTIONS carries the partitions that turned up
    meanwhile, so the transaction still adds them in one call."""
    from concurrent.futures import Future

    from sdk._config import ProducerConfig
    from sdk._producer_base import ProducerCore

    core = ProducerCore(ProducerConfig("http://c", transactional_id="tid"), batch_future=Future)
    core.txn.begin_init()
    core.txn.complete_init(7, 0)
    core.txn.begin_transaction()
    core.txn.maybe_add_partition(TP0)
    tps = core.txn.partitions_to_add()
    assert core.add_partitions_body(tps)["partitions"] == [{"topic": "t", "partition": 0}]
    core.txn.maybe_add_partition(TP1)
    assert core.txn.partitions_to_add() == []  # the call is still going on
    retry = core.add_partitions_body(tps)
    assert [p["partition"] for p in retry["partitions"]] == [0, 1]
    core.on_add_result(tps, {"partitions": [{"topic": "t", "partition": 0, "error": None},
                                            {"topic": "t", "partition": 1, "error": None}]})
    assert core.txn.partitions == {TP0, TP1} and not core.txn.adding


def test_idempotent_producer_resolves_retries_before_taking_a_new_id() -> None:
    """After a sequence error the producer takes a new id only once nothing is in flight;
    batches waiting for a retry must still be sent meanwhile (or it would wait forever)."""
    from concurrent.futures import Future

    from sdk import KafkaStorageError
    from sdk._config import ProducerConfig
    from sdk._producer_base import ProducerCore

    core = ProducerCore(ProducerConfig("http://c", linger_ms=0, batch_size=100),
                        batch_future=Future)
    core.metadata.update_topic({"name": "t", "partitions": [
        {"partition": p, "leader": {"node_id": 1, "url": "http://n"}} for p in (0, 1)]})
    core.on_producer_id({"producer_id": 9, "producer_epoch": 0})
    for partition in (0, 1):
        core.append(TopicPartition("t", partition), None, "v", None, None, Future(), False)
    sent = core.next_actions().batches
    assert len(sent) == 2
    broken, retried = sent
    core.on_produce_error(broken, OutOfOrderSequenceNumberError("gap"))  # at the head
    core.on_produce_error(retried, KafkaStorageError("disk"))  # will be retried
    core.append(TopicPartition("t", 0), None, "later", None, None, Future(), False)
    retried.retry_at_ms = 0
    actions = core.next_actions()
    assert actions.batches == [retried] and not actions.init_producer_id
    core.on_produce_ok(retried, {"base_offset": 0, "log_append_time_ms": 1})
    assert core.next_actions().init_producer_id  # now the new id, then the new batch
