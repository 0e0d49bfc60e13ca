"""The pure rule of the hanging-transaction detector (coordinator_service/hanging/rule.py).

One open transaction on a partition against the record holding its producer id: hanging
or not, why, and what may be done. The property at the end is the one that guards data:
batches a commit decision covers are never given an abort.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from coordinator_service.hanging.rule import (
    Action,
    Verdict,
    bumped,
    classify,
    manual_abort_refusal,
)
from coordinator_service.transactions.state import TxnRecord, new_record
from eos_protocol.common import MAX_PRODUCER_EPOCH
from eos_protocol.coordinator import TRANSACTION_VERSION_2
from eos_protocol.hanging import HangingReason, OpenTransaction
from eos_protocol.node import MarkerResult
from eos_protocol.states import TransactionState as S

pytestmark = pytest.mark.unit

PID, EPOCH = 1000, 4
MAX_TIMEOUT, MARGIN, NOW = 900_000, 60_000, 10_000_000
TP = ("orders", 0)


def open_txn(pid: int = PID, epoch: int = EPOCH, age_ms: int = 1_000,
             tp: tuple[str, int] = TP) -> OpenTransaction:  # fmt: skip
    return OpenTransaction(topic=tp[0], partition=tp[1], producer_id=pid,
                           producer_epoch=epoch, coordinator_epoch=2, first_offset=17,
                           age_ms=age_ms)  # fmt: skip


def record(state: S, *, epoch: int = EPOCH, partitions: tuple[tuple[str, int], ...] = (TP,),
           **changes: object) -> TxnRecord:  # fmt: skip
    rec = new_record("tid", 3, PID, 60_000, NOW - 5_000, 2)
    values: dict[str, object] = {
        "state": state, "producer_epoch": epoch, "last_producer_id": PID,
        "last_producer_epoch": epoch - 1, "partitions": partitions, "txn_start_ms": NOW - 5_000,
    }
    return rec.replace(**{**values, **changes})


def judge(txn: OpenTransaction, rec: TxnRecord | None) -> Verdict:
    return classify(txn, rec, now_ms=NOW, max_timeout_ms=MAX_TIMEOUT, margin_ms=MARGIN)


OLD = MAX_TIMEOUT + MARGIN + 1


def test_a_producer_no_record_holds_is_aborted_with_the_bumped_epoch() -> None:
    verdict = judge(open_txn(), None)
    assert verdict.reason is HangingReason.UNKNOWN_PRODUCER
    assert (verdict.action, verdict.marker, verdict.marker_epoch) == (
        Action.MARKER, MarkerResult.ABORT, EPOCH + 1)
    assert verdict.transactional_id is None and verdict.coordinator_state is None
    assert manual_abort_refusal(verdict) is None


def test_an_ongoing_transaction_with_the_partition_is_not_hanging() -> None:
    verdict = judge(open_txn(), record(S.ONGOING))
    assert not verdict.hanging and verdict.action is Action.NONE
    assert verdict.coordinator_state is S.ONGOING
    assert manual_abort_refusal(verdict) is not None  # ended through its transactional id


def test_an_ongoing_transaction_too_old_is_left_to_the_coordinator_until_its_timeout() -> None:
    young_record = record(S.ONGOING)
    verdict = judge(open_txn(age_ms=OLD), young_record)
    assert verdict.reason is HangingReason.OLDER_THAN_MAX_TIMEOUT
    assert verdict.action is Action.NONE and verdict.marker is None
    overdue = record(S.ONGOING, txn_start_ms=NOW - 61_000)
    verdict = judge(open_txn(age_ms=OLD), overdue)
    assert verdict.action is Action.COORDINATOR_ABORT
    assert manual_abort_refusal(verdict) is not None


def test_a_partition_never_added_is_aborted() -> None:
    verdict = judge(open_txn(tp=("orders", 1)), record(S.ONGOING))
    assert verdict.reason is HangingReason.PARTITION_NOT_ADDED
    assert (verdict.marker, verdict.marker_epoch) == (MarkerResult.ABORT, EPOCH + 1)
    assert manual_abort_refusal(verdict) is None


def test_a_zombie_of_an_older_epoch_is_aborted() -> None:
    verdict = judge(open_txn(epoch=EPOCH - 2), record(S.ONGOING))
    assert verdict.reason is HangingReason.NOT_ONGOING_AT_COORDINATOR
    assert (verdict.marker, verdict.marker_epoch) == (MarkerResult.ABORT, EPOCH - 1)
    assert verdict.coordinator_state is S.ONGOING and verdict.transactional_id == "tid"


def test_a_lost_commit_marker_gets_the_commit_again_never_an_abort() -> None:
    verdict = judge(open_txn(), record(S.COMPLETE_COMMIT))
    assert verdict.reason is HangingReason.NOT_ONGOING_AT_COORDINATOR
    assert (verdict.action, verdict.marker, verdict.marker_epoch) == (
        Action.MARKER, MarkerResult.COMMIT, EPOCH)
    assert verdict.commits
    assert manual_abort_refusal(verdict) is not None


def test_a_version_2_commit_is_recognised_by_the_last_epoch_and_rollover() -> None:
    bumped_record = record(S.COMPLETE_COMMIT, epoch=EPOCH + 1, last_producer_epoch=EPOCH,
                           transaction_version=TRANSACTION_VERSION_2)  # fmt: skip
    verdict = judge(open_txn(), bumped_record)
    assert (verdict.marker, verdict.marker_epoch) == (MarkerResult.COMMIT, EPOCH + 1)
    rolled = record(S.COMPLETE_COMMIT, epoch=0, producer_id=PID + 1,
                    last_producer_epoch=MAX_PRODUCER_EPOCH - 1,
                    transaction_version=TRANSACTION_VERSION_2)  # fmt: skip
    verdict = judge(open_txn(epoch=MAX_PRODUCER_EPOCH - 1), rolled)
    assert (verdict.marker, verdict.marker_epoch) == (MarkerResult.COMMIT, MAX_PRODUCER_EPOCH)


def test_a_commit_still_preparing_is_left_to_its_markers_then_resumed() -> None:
    assert not judge(open_txn(), record(S.PREPARE_COMMIT)).hanging
    verdict = judge(open_txn(age_ms=OLD), record(S.PREPARE_COMMIT))
    assert verdict.reason is HangingReason.OLDER_THAN_MAX_TIMEOUT
    assert verdict.action is Action.RESUME_MARKERS and verdict.commits
    assert manual_abort_refusal(verdict) is not None


def test_an_epoch_a_commit_may_have_covered_is_left_to_a_person() -> None:
    """Version 1 keeps one previous epoch and not its outcome: its batches may be
    committed data, so neither marker is chosen."""
    verdict = judge(open_txn(epoch=EPOCH - 1), record(S.COMPLETE_COMMIT))
    assert verdict.reason is HangingReason.NOT_ONGOING_AT_COORDINATOR
    assert verdict.action is Action.NONE and verdict.marker is None
    assert verdict.commits and manual_abort_refusal(verdict) is not None


def test_batches_no_commit_covers_are_aborted_even_when_the_record_commits() -> None:
    older = judge(open_txn(epoch=EPOCH - 3), record(S.COMPLETE_COMMIT))
    assert older.marker is MarkerResult.ABORT and not older.commits
    not_added = judge(open_txn(tp=("orders", 1)), record(S.COMPLETE_COMMIT))
    assert not_added.reason is HangingReason.PARTITION_NOT_ADDED
    assert not_added.marker is MarkerResult.ABORT


def test_aborts_of_the_coordinator_keep_its_epoch() -> None:
    assert not judge(open_txn(), record(S.PREPARE_ABORT)).hanging
    assert judge(open_txn(age_ms=OLD), record(S.PREPARE_ABORT)).action is Action.RESUME_MARKERS
    lost = judge(open_txn(), record(S.COMPLETE_ABORT))
    assert (lost.marker, lost.marker_epoch) == (MarkerResult.ABORT, EPOCH)
    empty = judge(open_txn(), record(S.EMPTY))
    assert (empty.marker, empty.marker_epoch) == (MarkerResult.ABORT, EPOCH + 1)


def test_a_record_of_another_producer_id_does_not_vouch_for_this_one() -> None:
    verdict = judge(open_txn(pid=PID + 7), record(S.ONGOING))
    assert verdict.reason is HangingReason.NOT_ONGOING_AT_COORDINATOR
    assert verdict.marker is MarkerResult.ABORT


def test_the_top_epoch_cannot_be_bumped() -> None:
    assert bumped(MAX_PRODUCER_EPOCH) == MAX_PRODUCER_EPOCH
    assert judge(open_txn(epoch=MAX_PRODUCER_EPOCH), None).marker_epoch == MAX_PRODUCER_EPOCH


@given(
    state=hs.sampled_from([S.PREPARE_COMMIT, S.COMPLETE_COMMIT]),
    version=hs.sampled_from([1, 2]),
    epoch=hs.integers(1, MAX_PRODUCER_EPOCH),
    shift=hs.integers(-1, 1),
    age_ms=hs.integers(0, 2 * OLD),
)
def test_batches_a_commit_covers_are_never_aborted(
    state: S, version: int, epoch: int, shift: int, age_ms: int
) -> None:
    """Whatever the record's epochs, batches of the id and epoch the commit decision names
    (or of one it may name) on a partition of the transaction get no abort, from the
    detector nor from an operator."""
    rec = record(state, epoch=epoch, transaction_version=version)
    covered = epoch + shift if version == 1 else epoch - 1
    if not 0 <= covered <= MAX_PRODUCER_EPOCH or shift == 1:
        return
    verdict = judge(open_txn(epoch=covered, age_ms=age_ms), rec)
    assert verdict.marker is not MarkerResult.ABORT
    assert verdict.commits or not verdict.hanging
    assert manual_abort_refusal(verdict) is not None
