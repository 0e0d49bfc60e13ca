"""A transactional id's record and the pure rules that move it from state to state.

Nothing here does I/O. The coordinator (``lifecycle.py``) asks these functions for the next
record, makes it durable with a fenced write, and only then acknowledges. The table of
legal moves is ``table.decide``; this module adds the producer checks (who
may speak for the id) and the bookkeeping Kafka's ``TransactionMetadata`` carries (epochs,
the previous producer id after a rollover, partitions, start time).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

from coordinator_service.transactions.table import (
    TxnEvent,
    decision_of,
    may_expire,
    starts_new_transaction,
)
from eos_protocol.common import MAX_PRODUCER_EPOCH
from eos_protocol.coordinator import TRANSACTION_VERSION_1, TRANSACTION_VERSION_2
from eos_protocol.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    ProducerFencedError,
)
from eos_protocol.states import TransactionState

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

TopicPartitionKey = tuple[str, int]


def txn_log_partition(transactional_id: str, partitions: int) -> int:
    """Which transaction-log partition (and so which lease) owns this id."""
    return zlib.crc32(transactional_id.encode()) % partitions


@dataclass(frozen=True)
class TxnRecord:
    """One row of the transaction log, immutable: each change makes a new record."""

    transactional_id: str
    txn_log_partition: int
    producer_id: int
    producer_epoch: int
    last_producer_id: int
    last_producer_epoch: int
    state: TransactionState
    timeout_ms: int
    txn_start_ms: int | None
    last_update_ms: int
    partitions: tuple[TopicPartitionKey, ...]
    groups: tuple[str, ...]
    coordinator_epoch: int
    # 2: the storage nodes add partitions and every end bumps the epoch (KIP-890 part 2)
    transaction_version: int = TRANSACTION_VERSION_1
    # the id a version-2 end hands out when the bump exhausted the epoch; it replaces
    # ``producer_id`` when the transaction completes (NO_PRODUCER_ID: none)
    next_producer_id: int = NO_PRODUCER_ID

    def replace(self, **changes: object) -> TxnRecord:
        """A copy with ``changes``: every request makes two or three, so it copies the
        instance's dictionary instead of ``dataclasses.replace``'s walk over the fields
        and checked constructor (a twentieth of the coordinator's CPU per transaction).
        A name that is not a field is refused as ``dataclasses.replace`` refuses it."""
        unknown = changes.keys() - _RECORD_FIELDS
        if unknown:
            raise TypeError(f"TxnRecord has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(TxnRecord)
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return copy

    @property
    def decision(self) -> TxnEvent | None:
        return decision_of(self.state)

    @property
    def bumps_at_end(self) -> bool:
        """Whether commit and abort bump the epoch (transaction version 2)."""
        return self.transaction_version >= TRANSACTION_VERSION_2

    @property
    def client_ids(self) -> tuple[int, int]:
        """The producer id and epoch the client continues with: during a rollover the
        new id at epoch 0, before the record itself switches to it at completion."""
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(TxnRecord))


def producer_ids_of(rec: TxnRecord) -> set[int]:
    """The producer ids that speak for ``rec``'s transactional id: its own, and the new
    one of a pending version-2 rollover."""
    if rec.next_producer_id == NO_PRODUCER_ID:
        return {rec.producer_id}
    return {rec.producer_id, rec.next_producer_id}


@dataclass(frozen=True)
class EndResult:
    """A commit's or abort's answer: the state, and the producer id and epoch the client
    goes on with (``bumped``: under transaction version 2, which the answer names)."""

    state: TransactionState
    producer_id: int
    producer_epoch: int
    bumped: bool = False


def new_record(
    transactional_id: str,
    log_partition: int,
    producer_id: int,
    timeout_ms: int,
    now_ms: int,
    coordinator_epoch: int,
    transaction_version: int = TRANSACTION_VERSION_1,
) -> TxnRecord:
    """The record ``init`` writes for an id seen for the first time."""
    return TxnRecord(
        transactional_id=transactional_id,
        txn_log_partition=log_partition,
        producer_id=producer_id,
        producer_epoch=0,
        last_producer_id=NO_PRODUCER_ID,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        state=TransactionState.EMPTY,
        timeout_ms=timeout_ms,
        txn_start_ms=None,
        last_update_ms=now_ms,
        partitions=(),
        groups=(),
        coordinator_epoch=coordinator_epoch,
        transaction_version=transaction_version,
    )


def check_producer(record: TxnRecord, producer_id: int, producer_epoch: int) -> None:
    """Refuse a request from anyone but the id's current producer (Kafka's checks).

    An id from before an epoch rollover, or an older epoch, is a zombie: PRODUCER_FENCED.
    Any other id is INVALID_PRODUCER_ID_MAPPING; a newer epoch than ours is
    INVALID_PRODUCER_EPOCH (it cannot come from a well-behaved client). The new id of a
    version-2 rollover is not the record's until the ending transaction completes:
    CONCURRENT_TRANSACTIONS until then.
    """
    if producer_id != record.producer_id and producer_id == record.next_producer_id:
        raise ConcurrentTransactionsError(
            f"producer id {producer_id} takes over transactional id "
            f"{record.transactional_id!r} once its previous transaction completes"
        )
    if producer_id != record.producer_id:
        if producer_id == record.last_producer_id:
            raise ProducerFencedError(
                f"producer id {producer_id} was replaced by {record.producer_id} "
                f"for transactional id {record.transactional_id!r}"
            )
        raise InvalidProducerIdMappingError(
            f"producer id {producer_id} does not belong to transactional id "
            f"{record.transactional_id!r}"
        )
    if producer_epoch < record.producer_epoch:
        raise ProducerFencedError(
            f"epoch {producer_epoch} is older than the current epoch {record.producer_epoch} "
            f"of transactional id {record.transactional_id!r}"
        )
    if producer_epoch > record.producer_epoch:
        raise InvalidProducerEpochError(
            f"epoch {producer_epoch} is newer than the current epoch {record.producer_epoch}"
        )


def needs_new_producer_id(record: TxnRecord) -> bool:
    """Whether the next ``init`` bump would exhaust the epoch (then the id rolls over).

    The top epoch is kept free so that a fence (timeout or a new ``init`` on an Ongoing
    transaction) can still bump once more and carry that epoch on its abort markers.
    """
    return record.producer_epoch + 1 >= MAX_PRODUCER_EPOCH


def bump_for_init(
    record: TxnRecord,
    now_ms: int,
    new_producer_id: int | None,
    transaction_version: int = TRANSACTION_VERSION_1,
) -> TxnRecord:
    """``init`` on an idle id: epoch + 1, or a new producer id at epoch 0 on rollover.

    The record takes the version the new producer speaks. Under version 2 an ended
    transaction's Complete* state becomes Empty (as Kafka does): a retried end is only
    recognised in Prepare*/Complete* (``is_end_retry``), and the epoch the old producer
    ended with must not be mistaken for such a retry once a new producer has taken over.
    """
    state = record.state
    if transaction_version >= TRANSACTION_VERSION_2 and state.is_complete:
        state = TransactionState.EMPTY
    if new_producer_id is not None:
        return record.replace(
            last_producer_id=record.producer_id,
            last_producer_epoch=record.producer_epoch,
            producer_id=new_producer_id,
            producer_epoch=0,
            state=state,
            transaction_version=transaction_version,
            last_update_ms=now_ms,
        )
    return record.replace(
        last_producer_id=record.producer_id,
        last_producer_epoch=record.producer_epoch,
        producer_epoch=record.producer_epoch + 1,
        state=state,
        transaction_version=transaction_version,
        last_update_ms=now_ms,
    )


def fence_and_prepare_abort(record: TxnRecord, now_ms: int) -> TxnRecord:
    """Fence the Ongoing transaction's producer (epoch + 1) and decide to abort it.

    The abort markers carry the new epoch, so every partition fences the old producer too.
    """
    epoch = min(record.producer_epoch + 1, MAX_PRODUCER_EPOCH)
    return record.replace(
        last_producer_id=record.producer_id,
        last_producer_epoch=record.producer_epoch,
        producer_epoch=epoch,
        state=TransactionState.PREPARE_ABORT,
        last_update_ms=now_ms,
    )


def add_partitions(
    record: TxnRecord,
    partitions: list[TopicPartitionKey],
    groups: list[str],
    now_ms: int,
) -> TxnRecord:
    """Add to the open transaction, starting one (and its timer) if none is open."""
    if starts_new_transaction(record.state):
        current: tuple[TopicPartitionKey, ...] = ()
        current_groups: tuple[str, ...] = ()
        start: int | None = now_ms
    else:
        current, current_groups, start = record.partitions, record.groups, record.txn_start_ms
    merged = tuple(sorted(set(current) | set(partitions)))
    merged_groups = tuple(sorted(set(current_groups) | set(groups)))
    return record.replace(
        state=TransactionState.ONGOING,
        partitions=merged,
        groups=merged_groups,
        txn_start_ms=start,
        last_update_ms=now_ms,
    )


def adds_nothing(record: TxnRecord, partitions: list[TopicPartitionKey], groups: list[str]) -> bool:
    """An add that repeats what the Ongoing transaction has already: no write needed."""
    return (
        record.state is TransactionState.ONGOING
        and set(partitions) <= set(record.partitions)
        and set(groups) <= set(record.groups)
    )


def end_exhausts_epoch(record: TxnRecord) -> bool:
    """Whether a version-2 end must hand out a new producer id: the bumped epoch would
    be the top one, which stays the fence's (``needs_new_producer_id``)."""
    return record.bumps_at_end and needs_new_producer_id(record)


def prepare_end(
    record: TxnRecord, commit: bool, now_ms: int, new_producer_id: int | None = None
) -> TxnRecord:
    """Ongoing -> Prepare*. Version 2 bumps the epoch in the same durable write: the
    markers carry the new epoch, so every partition of the transaction fences a late batch
    of the old one, and an add at the old epoch is refused (KIP-890 part 2). The old
    (id, epoch) is kept as the last one, so a retried end is recognised. When the bump
    reaches the top epoch (``new_producer_id`` given) the markers still go out under the
    old id and the client continues with the new id at epoch 0."""
    target = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
    if not record.bumps_at_end:
        return record.replace(state=target, last_update_ms=now_ms)
    return record.replace(
        state=target,
        last_producer_id=record.producer_id,
        last_producer_epoch=record.producer_epoch,
        producer_epoch=min(record.producer_epoch + 1, MAX_PRODUCER_EPOCH),
        next_producer_id=NO_PRODUCER_ID if new_producer_id is None else new_producer_id,
        last_update_ms=now_ms,
    )


def is_end_retry(record: TxnRecord, producer_id: int, producer_epoch: int) -> bool:
    """A version-2 end repeated at the epoch it bumped (its answer was lost): the id and
    epoch before the bump are the record's last ones. The state decides whether it is a
    retry of the same decision (``decide``)."""
    return (
        record.bumps_at_end
        and (record.state.is_prepare or record.state.is_complete)
        and (producer_id, producer_epoch) == (record.last_producer_id, record.last_producer_epoch)
    )


def complete(record: TxnRecord, now_ms: int) -> TxnRecord:
    """Prepare* -> Complete* once every partition has its marker. A version-2 rollover
    switches to the new producer id here; the last epoch stays the one the client ended
    with, so its retried end is still recognised (``is_end_retry``)."""
    target = (
        TransactionState.COMPLETE_COMMIT
        if record.state is TransactionState.PREPARE_COMMIT
        else TransactionState.COMPLETE_ABORT
    )
    if record.next_producer_id != NO_PRODUCER_ID:
        return record.replace(
            state=target,
            producer_id=record.next_producer_id,
            producer_epoch=0,
            next_producer_id=NO_PRODUCER_ID,
            last_update_ms=now_ms,
        )
    return record.replace(state=target, last_update_ms=now_ms)


def is_timed_out(record: TxnRecord, now_ms: int) -> bool:
    return (
        record.state is TransactionState.ONGOING
        and record.txn_start_ms is not None
        and now_ms > record.txn_start_ms + record.timeout_ms
    )


def is_expired(record: TxnRecord, now_ms: int, expiration_ms: int) -> bool:
    return may_expire(record.state) and now_ms > record.last_update_ms + expiration_ms
