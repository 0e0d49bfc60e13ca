"""Pure tests of the transition table (docs/design.md §3) and of the record rules built on it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from coordinator_service.transactions import state as st
from coordinator_service.transactions import store
from coordinator_service.transactions.table import Outcome, TxnEvent, can_transition, decide
from eos_protocol.common import MAX_PRODUCER_EPOCH
from eos_protocol.errors import (
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    ProducerFencedError,
)
from eos_protocol.partitioning import group_offsets_partition
from eos_protocol.states import TransactionState

pytestmark = pytest.mark.unit

S = TransactionState
E = TxnEvent

# (state, event, last decision matches) -> outcome, target: the table of §3, row by row.
TABLE = [
    (S.EMPTY, E.ADD, False, Outcome.TRANSITION, S.ONGOING),
    (S.EMPTY, E.COMMIT, False, Outcome.INVALID, None),
    (S.EMPTY, E.ABORT, False, Outcome.INVALID, None),
    (S.EMPTY, E.INIT, False, Outcome.BUMP_EPOCH, S.EMPTY),
    (S.EMPTY, E.TIMEOUT, False, Outcome.IGNORE, None),
    (S.COMPLETE_COMMIT, E.ADD, False, Outcome.TRANSITION, S.ONGOING),
    (S.COMPLETE_COMMIT, E.COMMIT, True, Outcome.RETRY_SUCCESS, S.COMPLETE_COMMIT),
    (S.COMPLETE_COMMIT, E.ABORT, False, Outcome.INVALID, None),
    (S.COMPLETE_ABORT, E.ABORT, True, Outcome.RETRY_SUCCESS, S.COMPLETE_ABORT),
    (S.COMPLETE_ABORT, E.COMMIT, False, Outcome.INVALID, None),
    (S.COMPLETE_ABORT, E.INIT, False, Outcome.BUMP_EPOCH, S.COMPLETE_ABORT),
    (S.ONGOING, E.ADD, False, Outcome.STAY, S.ONGOING),
    (S.ONGOING, E.COMMIT, False, Outcome.TRANSITION, S.PREPARE_COMMIT),
    (S.ONGOING, E.ABORT, False, Outcome.TRANSITION, S.PREPARE_ABORT),
    (S.ONGOING, E.INIT, False, Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT),
    (S.ONGOING, E.TIMEOUT, False, Outcome.FENCE_AND_ABORT, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, E.ADD, False, Outcome.CONCURRENT, None),
    (S.PREPARE_COMMIT, E.COMMIT, True, Outcome.RETRY_SUCCESS, S.PREPARE_COMMIT),
    (S.PREPARE_COMMIT, E.ABORT, False, Outcome.INVALID, None),
    (S.PREPARE_COMMIT, E.INIT, False, Outcome.CONCURRENT, None),
    (S.PREPARE_ABORT, E.ABORT, True, Outcome.RETRY_SUCCESS, S.PREPARE_ABORT),
    (S.PREPARE_ABORT, E.INIT, False, Outcome.CONCURRENT, None),
    (S.PREPARE_ABORT, E.TIMEOUT, False, Outcome.IGNORE, None),
    (S.PREPARE_ABORT, E.COMMIT, False, Outcome.INVALID, None),
    (S.DEAD, E.ADD, False, Outcome.INVALID, None),
]


@pytest.mark.parametrize(("state", "event", "matches", "outcome", "target"), TABLE)
def test_table(
    state: S, event: E, matches: bool, outcome: Outcome, target: S | None
) -> None:
    decision = decide(state, event, last_decision_matches=matches)
    assert decision.outcome is outcome
    assert decision.target is target


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("event", list(E))
def test_every_transition_the_table_makes_is_a_legal_state_move(state: S, event: E) -> None:
    for matches in (False, True):
        decision = decide(state, event, last_decision_matches=matches)
        if decision.outcome in (Outcome.TRANSITION, Outcome.FENCE_AND_ABORT):
            assert decision.target is not None
            if decision.outcome is Outcome.FENCE_AND_ABORT:
                assert can_transition(state, S.PREPARE_EPOCH_FENCE)
                assert can_transition(S.PREPARE_EPOCH_FENCE, decision.target)
            else:
                assert can_transition(state, decision.target)


def _rec(**changes: object) -> st.TxnRecord:
    return st.new_record("tid", 3, 1000, 60_000, 0, 1).replace(**changes)


def test_producer_checks() -> None:
    rec = _rec(producer_epoch=5, last_producer_id=7, last_producer_epoch=9)
    st.check_producer(rec, 1000, 5)
    with pytest.raises(ProducerFencedError):
        st.check_producer(rec, 1000, 4)
    with pytest.raises(InvalidProducerEpochError):
        st.check_producer(rec, 1000, 6)
    with pytest.raises(ProducerFencedError):  # the id from before a rollover
        st.check_producer(rec, 7, 9)
    with pytest.raises(InvalidProducerIdMappingError):
        st.check_producer(rec, 8, 5)


def test_init_bump_and_rollover() -> None:
    rec = _rec(producer_epoch=4)
    bumped = st.bump_for_init(rec, 10, None)
    assert (bumped.producer_id, bumped.producer_epoch) == (1000, 5)
    assert (bumped.last_producer_id, bumped.last_producer_epoch) == (1000, 4)
    near = _rec(producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert st.needs_new_producer_id(near)
    assert not st.needs_new_producer_id(_rec(producer_epoch=MAX_PRODUCER_EPOCH - 2))
    rolled = st.bump_for_init(near, 10, 2000)
    assert (rolled.producer_id, rolled.producer_epoch) == (2000, 0)
    assert (rolled.last_producer_id, rolled.last_producer_epoch) == (1000, MAX_PRODUCER_EPOCH - 1)
    # a fence can still bump once at the top
    fenced = st.fence_and_prepare_abort(near.replace(state=S.ONGOING), 10)
    assert fenced.producer_epoch == MAX_PRODUCER_EPOCH and fenced.state is S.PREPARE_ABORT


def test_add_partitions_starts_and_extends_a_transaction() -> None:
    rec = st.add_partitions(_rec(), [("a", 1)], [], 100)
    assert rec.state is S.ONGOING and rec.txn_start_ms == 100 and rec.partitions == (("a", 1),)
    rec2 = st.add_partitions(rec, [("a", 0), ("a", 1)], ["g"], 200)
    assert rec2.partitions == (("a", 0), ("a", 1)) and rec2.groups == ("g",)
    assert rec2.txn_start_ms == 100
    assert st.adds_nothing(rec2, [("a", 1)], ["g"])
    done = st.complete(st.prepare_end(rec2, True, 300), 400)
    assert done.state is S.COMPLETE_COMMIT
    again = st.add_partitions(done, [("b", 0)], [], 500)
    assert again.partitions == (("b", 0),) and again.groups == () and again.txn_start_ms == 500


def test_timeout_and_expiry_predicates() -> None:
    ongoing = st.add_partitions(_rec(timeout_ms=1000), [("a", 0)], [], 100)
    assert not st.is_timed_out(ongoing, 1100)
    assert st.is_timed_out(ongoing, 1101)
    assert not st.is_expired(ongoing, 10**12, 10)
    idle = _rec(last_update_ms=0)
    assert st.is_expired(idle, 11, 10) and not st.is_expired(idle, 10, 10)


def test_partition_hashes_are_crc32() -> None:
    import zlib

    assert st.txn_log_partition("abc", 50) == zlib.crc32(b"abc") % 50
    assert group_offsets_partition("g", 50) == zlib.crc32(b"g") % 50


def test_a_record_copy_changes_only_what_it_names_and_refuses_unknown_names() -> None:
    rec = st.new_record("t", 3, producer_id=7, timeout_ms=60_000, now_ms=1, coordinator_epoch=2)
    copy = rec.replace(state=S.ONGOING, partitions=(("orders", 0),))
    expected = dataclasses.replace(rec, state=S.ONGOING, partitions=(("orders", 0),))
    assert copy == expected and hash(copy) == hash(expected)
    assert rec.state is S.EMPTY and rec.partitions == ()
    with pytest.raises(TypeError, match="'stat'"):
        rec.replace(stat=S.ONGOING)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.state = S.EMPTY  # type: ignore[misc]


def test_the_fenced_update_is_given_every_parameter_its_statement_names() -> None:
    rec = st.new_record("t", 3, producer_id=7, timeout_ms=60_000, now_ms=1, coordinator_epoch=2)
    rec = rec.replace(partitions=(("orders", 0), ("b", 12)), groups=("g",))
    params = store._fenced_params(rec, store.LeaseToken(3, "me", 2), 5)
    named = set(re.findall(r"%\((\w+)\)s", store.FENCED_UPDATE_SQL))
    assert set(params) == named
    assert params["new_partitions"] == '[["orders",0],["b",12]]'
    assert params["new_groups"] == '["g"]' and params["key_tid"] == "t"
    assert store.record_from_row(_Row(store._values(rec))) == rec


@dataclasses.dataclass
class _Row:
    """A database row as ``record_from_row`` reads it."""

    _mapping: dict[str, Any]
