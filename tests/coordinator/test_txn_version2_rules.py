"""Transaction version 2 (KIP-890 part 2) in the coordinator's pure rules
(``coordinator_service/transactions/state.py``): the epoch bump of every end, the retry of
an end whose answer was lost, the producer-id rollover when the bump exhausts the epoch,
and what an ``init`` of the new flow does to an ended transaction. Version 1 records must
come out of the same functions exactly as before."""

from __future__ import annotations

import pytest

from coordinator_service.transactions import state as st
from coordinator_service.transactions.table import Outcome, TxnEvent, decide
from eos_protocol.common import MAX_PRODUCER_EPOCH
from eos_protocol.errors import ConcurrentTransactionsError, ProducerFencedError
from eos_protocol.states import TransactionState as S

pytestmark = pytest.mark.unit


def _ongoing(version: int, epoch: int = 4) -> st.TxnRecord:
    rec = st.new_record("tid", 3, 1000, 60_000, 0, 1, version).replace(producer_epoch=epoch)
    return st.add_partitions(rec, [("a", 0)], [], 100)


@pytest.mark.parametrize("commit", [True, False])
def test_version_1_end_keeps_the_epoch(commit: bool) -> None:
    rec = _ongoing(1)
    prepared = st.prepare_end(rec, commit, 200)
    assert (prepared.producer_id, prepared.producer_epoch) == (1000, 4)
    assert (prepared.last_producer_id, prepared.last_producer_epoch) == (-1, -1)
    assert prepared.client_ids == (1000, 4)
    assert not st.is_end_retry(prepared, 1000, 4)
    assert not st.end_exhausts_epoch(rec.replace(producer_epoch=MAX_PRODUCER_EPOCH - 1))


@pytest.mark.parametrize("commit", [True, False])
def test_version_2_end_bumps_the_epoch_in_the_prepare_write(commit: bool) -> None:
    rec = _ongoing(2)
    prepared = st.prepare_end(rec, commit, 200)
    assert prepared.state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
    assert (prepared.producer_id, prepared.producer_epoch) == (1000, 5)  # the markers' epoch
    assert (prepared.last_producer_id, prepared.last_producer_epoch) == (1000, 4)
    assert prepared.client_ids == (1000, 5)
    done = st.complete(prepared, 300)
    assert (done.producer_id, done.producer_epoch, done.client_ids) == (1000, 5, (1000, 5))
    # the ended epoch is now a zombie's, except for the retry of the very same end
    with pytest.raises(ProducerFencedError):
        st.check_producer(done, 1000, 4)
    st.check_producer(done, 1000, 5)
    for record in (prepared, done):
        assert st.is_end_retry(record, 1000, 4)
        assert not st.is_end_retry(record, 1000, 5)
        assert not st.is_end_retry(record, 1000, 3)
        event = TxnEvent.COMMIT if commit else TxnEvent.ABORT
        other = TxnEvent.ABORT if commit else TxnEvent.COMMIT
        assert decide(record.state, event, last_decision_matches=record.decision is event
                      ).outcome is Outcome.RETRY_SUCCESS
        assert decide(record.state, other, last_decision_matches=record.decision is other
                      ).outcome is Outcome.INVALID


def test_an_ongoing_transaction_is_no_end_retry() -> None:
    rec = _ongoing(2).replace(last_producer_id=1000, last_producer_epoch=3)
    assert not st.is_end_retry(rec, 1000, 3)


def test_version_2_end_at_the_top_epoch_rolls_over_to_a_new_producer_id() -> None:
    top = MAX_PRODUCER_EPOCH - 1
    assert not st.end_exhausts_epoch(_ongoing(2, top - 1))
    rec = _ongoing(2, top)
    assert st.end_exhausts_epoch(rec)
    prepared = st.prepare_end(rec, True, 200, new_producer_id=2000)
    # the markers fence the old id at the top epoch; the client continues with the new id
    assert (prepared.producer_id, prepared.producer_epoch) == (1000, MAX_PRODUCER_EPOCH)
    assert prepared.client_ids == (2000, 0)
    assert st.producer_ids_of(prepared) == {1000, 2000}
    with pytest.raises(ConcurrentTransactionsError):  # the new id waits for completion
        st.check_producer(prepared, 2000, 0)
    done = st.complete(prepared, 300)
    assert (done.producer_id, done.producer_epoch, done.next_producer_id) == (2000, 0, -1)
    assert st.producer_ids_of(done) == {2000}
    assert done.client_ids == (2000, 0)
    st.check_producer(done, 2000, 0)
    with pytest.raises(ProducerFencedError):  # the old id is the last one: fenced
        st.check_producer(done, 1000, MAX_PRODUCER_EPOCH)
    assert st.is_end_retry(done, 1000, top)  # its lost answer can still be had


def test_version_2_init_empties_an_ended_transaction() -> None:
    """After an init the ended epoch is the fenced producer's: its end must not pass for
    a retry, which would hand it the new producer's epoch."""
    done = st.complete(st.prepare_end(_ongoing(2), True, 200), 300)
    bumped = st.bump_for_init(done, 400, None, 2)
    assert bumped.state is S.EMPTY and bumped.producer_epoch == 6
    assert not st.is_end_retry(bumped, 1000, 5)
    with pytest.raises(ProducerFencedError):
        st.check_producer(bumped, 1000, 5)
    # version 1 keeps today's rule: the state stays, and the record goes back to version 1
    old_flow = st.bump_for_init(done, 400, None)
    assert old_flow.state is S.COMPLETE_COMMIT and old_flow.transaction_version == 1
    assert not old_flow.bumps_at_end


def test_a_new_id_takes_the_requested_version() -> None:
    assert st.new_record("tid", 0, 1, 10, 0, 1).transaction_version == 1
    assert st.new_record("tid", 0, 1, 10, 0, 1, 2).bumps_at_end
