"""Producer state of one partition: idempotence and the open transaction of each producer.

For every producer id the partition remembers its epoch, the coordinator epoch of the last
marker, the offset where its open transaction began and the metadata of its last five
batches. That is what turns a retried batch into a duplicate answered with its first
offsets, refuses gaps and stale epochs, and gives the Last Stable Offset. The same code
validates a live append and replays a batch read back from the log during recovery, so the
two can never disagree.

Slots. A batch may name a slot (``partition_service.log.batch``): several writers share
one producer id and epoch — the tasks of a Spark micro-batch, all writing in the driver's
one transaction — and each numbers its batches from 0 in a slot of its own. Sequences,
the last five batches and so duplicates are therefore kept per (producer id, slot); slot
0, every batch that names none, is the ``batches`` of the entry, exactly as before slots
existed. Everything else stays per producer id: the epoch (a new one starts every slot
at 0 and fences the old one in all of them), the open transaction and its first offset
(one marker ends the records of all its slots), the coordinator epoch.

What bounds the slots' memory: their states belong to the producer's epoch and go when
it moves on — a batch or a marker of a newer epoch, as every end does under transaction
version 2 — and a slot left idle past the producer expiration is forgotten like an idle
producer. A marker that keeps the epoch (transaction version 1) keeps them: a slot
dropped there would take a late retry of its last batch, arriving after the commit, for
a new slot's sequence 0 and append it again, possibly inside the producer's next
transaction. Each slot keeps its last five batches, as a producer does, because a
retried Spark task resends its batches after asking how far its slot got
(``last_sequence_of``), and in flight there may be up to five.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from eos_protocol.common import SEQUENCE_MODULUS
from eos_protocol.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceNumberError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from partition_service.log.batch import DEFAULT_SLOT, NO_SEQUENCE

REMEMBERED_BATCHES = 5
UNKNOWN_LAST_OFFSET = 2**62


def _in_slot(slot: int) -> str:
    return "" if slot == DEFAULT_SLOT else f" in slot {slot}"


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    append_time_ms: int


def _batches() -> deque[BatchMetadata]:
    return deque(maxlen=REMEMBERED_BATCHES)


def _batches_to_json(batches: deque[BatchMetadata]) -> list[list[int]]:
    return [
        [b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.append_time_ms] for b in batches
    ]


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    coordinator_epoch: int = -1
    current_txn_first_offset: int | None = None
    last_timestamp_ms: int = 0
    # append time of the open transaction's first batch here (its age: hanging detection)
    current_txn_start_ms: int | None = None
    # the offset of the producer's last batch here, data or marker (2**62: not known, from
    # an older checkpoint); once the log start passes it, the producer is forgotten
    last_offset: int = -1
    # the last batches of slot 0 (every batch without a slot), and of each other slot
    batches: deque[BatchMetadata] = field(default_factory=_batches)
    slots: dict[int, deque[BatchMetadata]] = field(default_factory=dict)

    @property
    def last_sequence(self) -> int:
        return self.last_sequence_of(DEFAULT_SLOT)

    def batches_of(self, slot: int) -> deque[BatchMetadata] | None:
        return self.batches if slot == DEFAULT_SLOT else self.slots.get(slot)

    def last_sequence_of(self, slot: int) -> int:
        """The last sequence written in ``slot`` at the current epoch (-1: none)."""
        batches = self.batches_of(slot)
        return batches[-1].last_seq if batches else NO_SEQUENCE

    def find_duplicate(
        self, first_seq: int, last_seq: int, slot: int = DEFAULT_SLOT
    ) -> BatchMetadata | None:
        for meta in self.batches_of(slot) or ():
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def remember(self, slot: int, meta: BatchMetadata) -> None:
        if slot == DEFAULT_SLOT:
            self.batches.append(meta)
        else:
            self.slots.setdefault(slot, _batches()).append(meta)

    def clear_sequences(self) -> None:
        """A new epoch: every slot starts again at sequence 0."""
        self.batches.clear()
        self.slots.clear()

    def expire_slots(self, now_ms: int, expiration_ms: int) -> None:
        """Forget the slots (other than 0) whose last batch is older than ``expiration_ms``;
        never while a transaction is open, whose retries they must still recognise."""
        if self.current_txn_first_offset is not None:
            return
        idle = [
            slot
            for slot, batches in self.slots.items()
            if not batches or now_ms - batches[-1].append_time_ms > expiration_ms
        ]
        for slot in idle:
            del self.slots[slot]

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.producer_id,
            "epoch": self.epoch,
            "coordinator_epoch": self.coordinator_epoch,
            "txn_first": self.current_txn_first_offset,
            "ts": self.last_timestamp_ms,
            "txn_start_ms": self.current_txn_start_ms,
            "last_offset": self.last_offset,
            "batches": _batches_to_json(self.batches),
            # only when there are any: a checkpoint without slots reads as before
            **(
                {"slots": [[slot, _batches_to_json(b)] for slot, b in sorted(self.slots.items())]}
                if self.slots
                else {}
            ),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ProducerEntry:
        entry = cls(
            producer_id=raw["pid"],
            epoch=raw["epoch"],
            coordinator_epoch=raw["coordinator_epoch"],
            current_txn_first_offset=raw["txn_first"],
            last_timestamp_ms=raw["ts"],
        )
        if entry.current_txn_first_offset is not None:
            # a checkpoint written before the start time was kept: the last append is the
            # closest time known (the transaction looks younger, never older)
            entry.current_txn_start_ms = raw.get("txn_start_ms", entry.last_timestamp_ms)
        for b in raw["batches"]:
            entry.batches.append(BatchMetadata(*b))
        for slot, batches in raw.get("slots", []):
            for b in batches:
                entry.remember(int(slot), BatchMetadata(*b))
        entry.last_offset = int(raw.get("last_offset", UNKNOWN_LAST_OFFSET))
        return entry


@dataclass(frozen=True, slots=True)
class AppendCheck:
    """What the state says about a batch before it is written."""

    duplicate_of: BatchMetadata | None = None  # answer with these offsets, write nothing
    opens_transaction: bool = False  # first transactional batch of this producer here


class ProducerStateManager:
    """All producers of one partition, plus the set of open transactions."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction on this partition
        self.open_transactions: dict[int, int] = {}

    # -- checks (no mutation) ------------------------------------------------------------
    def check_append(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        record_count: int,
        *,
        transactional: bool,
        slot: int = DEFAULT_SLOT,
    ) -> AppendCheck:
        """Validate an idempotent or transactional batch; raises the contract's errors.

        The epoch and the transaction are the producer's; the sequence is its ``slot``'s. A
        slot with no batch yet at the current epoch starts at 0, as a producer does."""
        entry = self.producers.get(producer_id)
        sequenced = base_sequence != NO_SEQUENCE
        last_seq = (
            (base_sequence + record_count - 1) % SEQUENCE_MODULUS if sequenced else NO_SEQUENCE
        )
        if entry is None:
            if sequenced and base_sequence != 0:
                raise UnknownProducerIdError(
                    f"producer {producer_id} is unknown here and its first batch has "
                    f"sequence {base_sequence}, not 0{_in_slot(slot)}"
                )
            return AppendCheck(opens_transaction=transactional)
        if epoch < entry.epoch:
            error = ProducerFencedError if transactional else InvalidProducerEpochError
            raise error(
                f"producer {producer_id} epoch {epoch} is older than "
                f"the current epoch {entry.epoch}"
            )
        in_txn = entry.current_txn_first_offset is not None
        if epoch > entry.epoch:
            if in_txn:
                raise ConcurrentTransactionsError(
                    f"producer {producer_id} still has a transaction open at epoch "
                    f"{entry.epoch}; its marker has not arrived yet"
                )
            if sequenced and base_sequence != 0:
                raise OutOfOrderSequenceNumberError(
                    f"producer {producer_id} new epoch {epoch} must start at sequence 0, "
                    f"got {base_sequence}{_in_slot(slot)}"
                )
            return AppendCheck(opens_transaction=transactional)
        if in_txn and not transactional:
            raise InvalidTxnStateError(
                f"producer {producer_id} has an open transaction; a non-transactional batch "
                "cannot join it"
            )
        if sequenced:
            duplicate = entry.find_duplicate(base_sequence, last_seq, slot)
            if duplicate is not None:
                return AppendCheck(duplicate_of=duplicate)
            last = entry.last_sequence_of(slot)
            expected = 0 if last == NO_SEQUENCE else (last + 1) % SEQUENCE_MODULUS
            if base_sequence != expected:
                raise OutOfOrderSequenceNumberError(
                    f"producer {producer_id} epoch {epoch}: expected sequence {expected}, "
                    f"got {base_sequence}{_in_slot(slot)}"
                )
        return AppendCheck(opens_transaction=transactional and not in_txn)

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker from coordinator epoch {coordinator_epoch}, but epoch "
                f"{entry.coordinator_epoch} wrote here already"
            )
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} epoch {epoch}, current epoch {entry.epoch}"
            )

    def marker_is_noop(self, producer_id: int, epoch: int) -> bool:
        """A marker that would change nothing: no open transaction and no newer epoch.

        A marker for a producer with no state here is written all the same (as Kafka does):
        it records the producer's epoch, so a batch of an older epoch that was verified just
        before the marker arrived is fenced instead of opening a transaction nobody ends.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return False
        return entry.current_txn_first_offset is None and epoch <= entry.epoch

    # -- updates (from live appends and from replay alike) --------------------------------
    def apply_data(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        base_offset: int,
        last_offset: int,
        append_time_ms: int,
        *,
        transactional: bool,
        slot: int = DEFAULT_SLOT,
    ) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            previous = entry
            entry = ProducerEntry(producer_id, epoch)
            if previous is not None:
                entry.coordinator_epoch = previous.coordinator_epoch
            self.producers[producer_id] = entry
        if base_sequence != NO_SEQUENCE:
            count = last_offset - base_offset + 1
            entry.remember(
                slot,
                BatchMetadata(
                    base_sequence,
                    (base_sequence + count - 1) % SEQUENCE_MODULUS,
                    base_offset,
                    last_offset,
                    append_time_ms,
                ),
            )
        entry.last_timestamp_ms = append_time_ms
        entry.last_offset = max(entry.last_offset, last_offset)
        if transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = base_offset
            entry.current_txn_start_ms = append_time_ms
            self.open_transactions[producer_id] = base_offset

    def apply_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        append_time_ms: int,
        offset: int = -1,
    ) -> int | None:
        """Close the producer's transaction, in all its slots; returns its first offset
        (None if none was open). The slots' sequences stay unless the epoch moves on (see
        the module's docstring: a late retry must still be a duplicate)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = ProducerEntry(producer_id, epoch)
            self.producers[producer_id] = entry
        elif epoch > entry.epoch:
            entry.epoch = epoch
            entry.clear_sequences()
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp_ms = append_time_ms
        entry.last_offset = max(entry.last_offset, offset)
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = None
        entry.current_txn_start_ms = None
        self.open_transactions.pop(producer_id, None)
        return first

    def first_unstable_offset(self) -> int | None:
        return min(self.open_transactions.values()) if self.open_transactions else None

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle past ``expiration_ms`` with nothing open (Kafka's
        ``producer.id.expiration.ms``), and the idle slots of the others."""
        for entry in self.producers.values():
            if entry.slots:
                entry.expire_slots(now_ms, expiration_ms)
        gone = [
            pid
            for pid, entry in self.producers.items()
            if entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp_ms > expiration_ms
        ]
        for pid in gone:
            del self.producers[pid]
        return gone

    # -- snapshot ------------------------------------------------------------------------
    def to_json(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in self.producers.values()]

    @classmethod
    def from_json(cls, raw: list[dict[str, Any]]) -> ProducerStateManager:
        manager = cls()
        for item in raw:
            entry = ProducerEntry.from_json(item)
            manager.producers[entry.producer_id] = entry
            if entry.current_txn_first_offset is not None:
                manager.open_transactions[entry.producer_id] = entry.current_txn_first_offset
        return manager
