"""The rule that tells a hanging transaction from a healthy one, and what may be done.

Pure: it compares one transaction open on a partition (as its leader reports it) with the
record of the transactional id holding that producer id (or ``None``), and answers a
``Verdict``. No I/O, no clock of its own, so it is tested on its own
(tests/coordinator/test_hanging_rule.py) and the detector, the admin endpoint and the
console all apply the same one.

A transaction open on a partition is *hanging* when

* no record holds its producer id (``unknown_producer``): an id never issued, a lost
  coordinator state, an expired transactional id;
* the record holds it, but not as Ongoing or preparing at that epoch with that partition
  (``not_ongoing_at_coordinator``: a lost marker, a zombie of an older epoch);
* it is Ongoing at that epoch, but the partition was never added (``partition_not_added``:
  a producer that wrote without adding it);
* or it is known, but open for longer than the maximum transaction timeout plus a margin
  (``older_than_max_timeout``).

What may be done is where data can be lost. Batches of a transaction the coordinator
decided to COMMIT (PrepareCommit/CompleteCommit for that producer id and epoch, with that
partition) are committed data whose marker did not arrive: the cure is the COMMIT marker
again, never an abort. An abort is only ever chosen when the record holds no commit that
could cover the batches; when the record is committing and the batches are of an epoch
that commit might have covered but the record cannot prove it (transaction version 1
keeps one previous epoch and not its outcome), nothing is done automatically and the
entry is reported for a person. A transaction the coordinator knows as Ongoing on that
partition is left to the coordinator's own timeout, which aborts it through the
transaction's every partition; only once that timeout has passed unheeded is the
coordinator asked to do it now.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from coordinator_service.transactions.state import NO_PRODUCER_ID, TxnRecord
from eos_protocol.common import MAX_PRODUCER_EPOCH
from eos_protocol.hanging import HangingReason, OpenTransaction
from eos_protocol.node import MarkerResult
from eos_protocol.states import TransactionState

COMMITTING = frozenset({TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT})


class Action(StrEnum):
    """What the detector does about a transaction (once it has hung long enough)."""

    NONE = "none"
    """Nothing: healthy, or hanging but only a person may decide (may be committed)."""
    MARKER = "marker"
    """Write ``Verdict.marker`` at ``Verdict.marker_epoch`` on the partition's leader."""
    RESUME_MARKERS = "resume_markers"
    """The record is Prepare*: its owner queues the decision's markers again."""
    COORDINATOR_ABORT = "coordinator_abort"
    """Ongoing past the record's own timeout: its owner aborts it (as expiry would)."""


@dataclass(frozen=True)
class Verdict:
    reason: HangingReason | None  # None: not hanging
    action: Action
    marker: MarkerResult | None = None
    marker_epoch: int | None = None
    transactional_id: str | None = None
    coordinator_state: TransactionState | None = None

    @property
    def hanging(self) -> bool:
        return self.reason is not None

    @property
    def commits(self) -> bool:
        """Whether the open batches are (or may be) committed data: never aborted."""
        return self.marker is MarkerResult.COMMIT or (
            self.coordinator_state in COMMITTING and self.marker is None
        )


def bumped(epoch: int) -> int:
    """KIP-664: the abort marker carries the open epoch + 1, so later batches of the old
    epoch are fenced on that partition (the top epoch cannot be bumped: it stays)."""
    return min(epoch + 1, MAX_PRODUCER_EPOCH)


def producer_ids(rec: TxnRecord) -> set[int]:
    """Every producer id the record speaks for, the previous one of a rollover included."""
    ids = {rec.producer_id, rec.last_producer_id, rec.next_producer_id}
    ids.discard(NO_PRODUCER_ID)
    return ids


def decided_identity(rec: TxnRecord) -> tuple[int, int] | None:
    """The (producer id, epoch) of the batches a Prepare*/Complete* decision covers.

    Transaction version 2 bumps the epoch (and may roll the id over) in the decision's own
    write, keeping the transaction's id and epoch as the record's last ones; version 1
    decides at the current ones.
    """
    if not (rec.state.is_prepare or rec.state.is_complete):
        return None
    if rec.bumps_at_end:
        return rec.last_producer_id, rec.last_producer_epoch
    return rec.producer_id, rec.producer_epoch


def classify(
    txn: OpenTransaction,
    rec: TxnRecord | None,
    *,
    now_ms: int,
    max_timeout_ms: int,
    margin_ms: int,
) -> Verdict:
    """Whether ``txn`` hangs, why, and what may be done about it (module docstring)."""
    old = txn.age_ms > max_timeout_ms + margin_ms
    abort = Verdict(
        HangingReason.NOT_ONGOING_AT_COORDINATOR, Action.MARKER, MarkerResult.ABORT,
        bumped(txn.producer_epoch),
        None if rec is None else rec.transactional_id, None if rec is None else rec.state,
    )  # fmt: skip
    if rec is None:
        return Verdict(
            HangingReason.UNKNOWN_PRODUCER, Action.MARKER, MarkerResult.ABORT,
            bumped(txn.producer_epoch),
        )  # fmt: skip
    ident = (txn.producer_id, txn.producer_epoch)
    added = (txn.topic, txn.partition) in rec.partitions
    if txn.producer_id not in producer_ids(rec):
        return abort  # the record speaks for other ids: it vouches for none of this one
    if rec.state in COMMITTING:
        return _committing(txn, rec, abort, old=old, added=added)
    if rec.state is TransactionState.ONGOING:
        if ident != (rec.producer_id, rec.producer_epoch):
            return abort  # a zombie of an older epoch
        if not added:
            return _reason(abort, HangingReason.PARTITION_NOT_ADDED)
        if not old:
            return _known(rec)
        started = rec.txn_start_ms
        overdue = started is not None and now_ms > started + rec.timeout_ms
        action = Action.COORDINATOR_ABORT if overdue else Action.NONE
        return Verdict(HangingReason.OLDER_THAN_MAX_TIMEOUT, action,
                       transactional_id=rec.transactional_id, coordinator_state=rec.state)
    epochs = {rec.producer_epoch, rec.last_producer_epoch}
    if rec.state is TransactionState.PREPARE_ABORT and added and txn.producer_epoch in epochs:
        if not old:
            return _known(rec)  # its markers are on their way
        return Verdict(HangingReason.OLDER_THAN_MAX_TIMEOUT, Action.RESUME_MARKERS,
                       transactional_id=rec.transactional_id, coordinator_state=rec.state)
    own_abort = rec.state is TransactionState.COMPLETE_ABORT and rec.producer_id == txn.producer_id
    if own_abort and added and txn.producer_epoch in epochs:
        # the coordinator's own abort whose marker was lost: its epoch, not a new fence
        return _reason(abort, abort.reason, epoch=max(rec.producer_epoch, txn.producer_epoch))
    return abort


def _committing(
    txn: OpenTransaction, rec: TxnRecord, abort: Verdict, *, old: bool, added: bool
) -> Verdict:
    """The record is PrepareCommit/CompleteCommit: commit what it covers, touch nothing it
    might cover, abort only batches it cannot (older epochs, partitions never added)."""
    ident = (txn.producer_id, txn.producer_epoch)
    if ident == decided_identity(rec):
        if not added:
            return _reason(abort, HangingReason.PARTITION_NOT_ADDED)
        if rec.state is TransactionState.PREPARE_COMMIT:
            if not old:
                return _known(rec)  # its markers are on their way
            return Verdict(HangingReason.OLDER_THAN_MAX_TIMEOUT, Action.RESUME_MARKERS,
                           transactional_id=rec.transactional_id, coordinator_state=rec.state)
        epoch = bumped(txn.producer_epoch) if rec.bumps_at_end else txn.producer_epoch
        return Verdict(
            HangingReason.NOT_ONGOING_AT_COORDINATOR, Action.MARKER, MarkerResult.COMMIT,
            epoch, rec.transactional_id, rec.state,
        )  # fmt: skip
    if added and txn.producer_epoch in (rec.producer_epoch, rec.last_producer_epoch):
        # an epoch the commit may have covered (version 1 after an init bump): a person
        # decides, with the records in hand
        return Verdict(HangingReason.NOT_ONGOING_AT_COORDINATOR, Action.NONE,
                       transactional_id=rec.transactional_id, coordinator_state=rec.state)
    return abort


def _known(rec: TxnRecord) -> Verdict:
    return Verdict(None, Action.NONE, transactional_id=rec.transactional_id,
                   coordinator_state=rec.state)


def _reason(verdict: Verdict, reason: HangingReason | None, *, epoch: int | None = None) -> Verdict:
    return Verdict(
        reason, verdict.action, verdict.marker,
        verdict.marker_epoch if epoch is None else epoch,
        verdict.transactional_id, verdict.coordinator_state,
    )  # fmt: skip


def manual_abort_refusal(verdict: Verdict) -> str | None:
    """Why an operator's abort of this open transaction is refused (None: it may go).

    Committed (or possibly committed) batches are never aborted; a transaction the
    coordinator holds as Ongoing or preparing is ended through its transactional id
    (``POST /v1/admin/transactions/{tid}/abort``), which aborts every partition of it.
    """
    if verdict.commits:
        return (
            f"the transaction is {verdict.coordinator_state} at the coordinator "
            f"({verdict.transactional_id!r}): its batches are committed data, not aborted"
        )
    state = verdict.coordinator_state
    if verdict.marker is None and state is not None and (
        state is TransactionState.ONGOING or state.is_prepare
    ):
        return (
            f"the coordinator holds this transaction as {state} ({verdict.transactional_id!r}): "
            "abort it through its transactional id"
        )
    return None
