"""The producer's client-side state machine (Kafka's ``TransactionManager``), with no I/O.

::

    UNINITIALIZED ─init─▶ INITIALIZING ─▶ READY ─begin─▶ IN_TRANSACTION ─commit─▶ COMMITTING
                              ▲             ▲  ▲                │   │                 │
                              │ (KIP-360    │  └──── done ──────┼───┼─────────────────┘
                              │  epoch bump)│                   │   └─abort─▶ ABORTING ─┐
                              └─────────────┴──── done ─────────┼────────────────────────┘
                                                 abortable error▼           ▲
                                                         ABORTABLE_ERROR ─abort─┘
                    any state ── fatal error (fenced, bad epoch, ...) ──▶ FATAL_ERROR

The producer asks this object before every call and tells it every answer; it refuses a
call made out of order with ``IllegalStateError`` (or re-raises the error that put it in
ABORTABLE_ERROR / FATAL_ERROR), so the rules are tested here without a server. It also
keeps the partitions of the open transaction. Under transaction version 1 a partition must
be added at the coordinator (one batched call for all new ones) before the first batch is
sent to it. Under version 2 (KIP-890 part 2) there is no such call: the storage node adds
the partition when the transaction's first batch reaches it, so a partition may be sent
to at once, and the transaction is open at the coordinator from its first batch sent.
Every commit or abort of version 2 bumps the epoch: the end's answer gives the id and
epoch to go on with, and sequence numbers restart at 0.
"""

from __future__ import annotations

import enum

from eos_protocol.coordinator import TRANSACTION_VERSION_1, TRANSACTION_VERSION_2
from eos_protocol.errors import AbortableError, EosError, FatalError
from sdk._errors import DeliveryTimeoutError, IllegalStateError, copy_error
from sdk._types import TopicPartition


class ProducerState(enum.Enum):
    """Where a producer is in its lifecycle (the diagram at the top of this module).

    Example::

        if producer.state is ProducerState.ABORTABLE_ERROR:
            producer.abort_transaction()
    """

    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = ProducerState

#: target -> the states it may be entered from (Kafka's ``State.isTransitionValid``).
_VALID_PREVIOUS: dict[ProducerState, frozenset[ProducerState]] = {
    S.UNINITIALIZED: frozenset(),
    S.INITIALIZING: frozenset({S.UNINITIALIZED, S.INITIALIZING, S.ABORTING_TRANSACTION}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.COMMITTING_TRANSACTION}),
    S.ABORTING_TRANSACTION: frozenset(
        {S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION}
    ),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR}),
    S.FATAL_ERROR: frozenset(ProducerState),
}

#: Errors after which the sequence numbers of this producer id and epoch can no longer be
#: trusted (KIP-360): the epoch is bumped before the next transaction.
SEQUENCE_ERRORS = frozenset({"OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID"})


def breaks_sequence(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the partition's sequence in doubt."""
    if isinstance(exc, DeliveryTimeoutError):
        return True
    return isinstance(exc, EosError) and exc.code in SEQUENCE_ERRORS


class TransactionManager:
    """State, producer id/epoch and the open transaction's partitions of one producer.

    ``transactional`` is false for the idempotent ``Producer``: it only goes
    UNINITIALIZED -> INITIALIZING -> READY and never enters a transaction.
    """

    def __init__(self, transactional_id: str | None) -> None:
        self.transactional_id = transactional_id
        self.state = S.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.last_error: BaseException | None = None
        self.epoch_bump_required = False
        self.partitions: set[TopicPartition] = set()  # added at the coordinator
        self.pending: set[TopicPartition] = set()  # to add before their first batch
        self.adding: set[TopicPartition] = set()  # in an add-partitions call right now
        self.opened: set[TopicPartition] = set()  # a batch acknowledged in this transaction
        self.groups: set[str] = set()  # offsets added (AddOffsetsToTxn)
        self.started_at_coordinator = False  # an add was sent: the end call is needed
        # the protocol the coordinator agreed to at init (1 until it says otherwise)
        self.transaction_version = TRANSACTION_VERSION_1

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def nodes_add_partitions(self) -> bool:
        """Transaction version 2: the storage nodes add partitions, ends bump the epoch."""
        return self.transactional and self.transaction_version >= TRANSACTION_VERSION_2

    def _transition(self, target: ProducerState) -> None:
        if self.state not in _VALID_PREVIOUS[target]:
            raise IllegalStateError(f"invalid transition {self.state.value} -> {target.value}")
        self.state = target

    def _raise_if_failed(self) -> None:
        """In FATAL_ERROR or ABORTABLE_ERROR every call but the way out raises the error
        that put the producer there (close it, or abort the transaction)."""
        if self.state in (S.FATAL_ERROR, S.ABORTABLE_ERROR):
            assert self.last_error is not None
            raise copy_error(self.last_error) from self.last_error

    # --- init ----------------------------------------------------------------------------

    def begin_init(self) -> None:
        if self.state is S.FATAL_ERROR:
            self._raise_if_failed()
        if self.state not in (S.UNINITIALIZED, S.INITIALIZING):
            raise IllegalStateError(f"init_transactions in state {self.state.value}")
        self._transition(S.INITIALIZING)

    def begin_epoch_bump(self) -> None:
        """After an abort that left the sequences in doubt (KIP-360)."""
        self._transition(S.INITIALIZING)

    def reset_producer_id(self) -> None:
        """An idempotent producer whose sequences are in doubt starts over with a new
        producer id (it has no transactional id to bump the epoch of)."""
        if self.transactional:
            raise IllegalStateError("a transactional producer bumps its epoch instead")
        self.state = S.UNINITIALIZED
        self.producer_id = self.producer_epoch = -1

    def complete_init(self, producer_id: int, producer_epoch: int) -> None:
        self._transition(S.READY)
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.epoch_bump_required = False
        self.last_error = None
        self._clear_transaction()

    # --- the transaction -----------------------------------------------------------------

    def _clear_transaction(self) -> None:
        self.partitions.clear()
        self.opened.clear()
        self.pending.clear()
        self.adding.clear()
        self.groups.clear()
        self.started_at_coordinator = False

    def _require_transactional(self, what: str) -> None:
        if not self.transactional:
            raise IllegalStateError(f"{what} needs a transactional producer")

    def begin_transaction(self) -> None:
        self._require_transactional("begin_transaction")
        self._raise_if_failed()
        if self.state is not S.READY:
            raise IllegalStateError(f"begin_transaction in state {self.state.value}")
        self._transition(S.IN_TRANSACTION)
        self._clear_transaction()

    def ensure_can_send(self) -> None:
        """Refuse a send unless the producer may append records now."""
        self._raise_if_failed()
        if self.transactional and self.state is not S.IN_TRANSACTION:
            raise IllegalStateError(
                f"send needs an open transaction (state {self.state.value}); "
                "call begin_transaction first"
            )

    def ensure_can_add_offsets(self) -> None:
        self._require_transactional("send_offsets_to_transaction")
        self._raise_if_failed()
        if self.state is not S.IN_TRANSACTION:
            raise IllegalStateError(f"send_offsets_to_transaction in state {self.state.value}")

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        if self.nodes_add_partitions:
            self.partitions.add(tp)  # the node adds it with the first batch
        elif self.transactional and tp not in self.partitions:
            self.pending.add(tp)

    def on_batch_sent(self, tp: TopicPartition) -> None:
        """A batch leaves for ``tp``. Under version 2 its node may add ``tp`` at the
        coordinator, which opens the transaction there, whatever becomes of the answer:
        from now on the transaction must be ended by a commit or abort call."""
        if self.nodes_add_partitions:
            self.started_at_coordinator = True

    def is_sendable(self, tp: TopicPartition) -> bool:
        """A batch may leave only for a partition the coordinator has added."""
        return not self.transactional or tp in self.partitions

    def in_flight_limit(self, tp: TopicPartition, max_in_flight: int) -> int:
        """How many batches of ``tp`` may await their answer now. In a transaction the
        first batch of a partition goes alone: it opens the transaction at the node, which
        first asks the coordinator (KIP-890), and batches sent behind it would be handled
        in any order while it waits, to come back OUT_OF_ORDER and be sent again."""
        if not self.transactional:
            return max_in_flight
        if tp not in self.partitions:
            return 0
        return max_in_flight if tp in self.opened else 1

    def on_batch_acked(self, tp: TopicPartition) -> None:
        if self.transactional:
            self.opened.add(tp)

    def partitions_to_add(self) -> list[TopicPartition]:
        """The partitions for the next add-partitions call (none while one is in flight)."""
        if (
            self.adding
            or not self.pending
            or self.state not in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION)
        ):
            return []
        return self.take_pending()

    def take_pending(self) -> list[TopicPartition]:
        """Move the pending partitions into the add-partitions call being made (also when
        it is retried, so partitions that turned up meanwhile share the call)."""
        if self.state not in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION):
            return []
        batch = sorted(self.pending)
        self.adding.update(batch)
        self.pending.clear()
        self.started_at_coordinator = True
        return batch

    def on_partitions_added(self, added: list[TopicPartition]) -> None:
        self.partitions.update(added)
        self.adding.difference_update(added)

    def on_add_failed(self, tps: list[TopicPartition], retry: bool) -> None:
        self.adding.difference_update(tps)
        if retry:
            self.pending.update(tps)

    def on_offsets_added(self, group_id: str) -> None:
        self.started_at_coordinator = True
        self.groups.add(group_id)

    def begin_commit(self) -> None:
        self._require_transactional("commit_transaction")
        self._raise_if_failed()
        if self.state not in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION):
            raise IllegalStateError(f"commit_transaction in state {self.state.value}")
        self._transition(S.COMMITTING_TRANSACTION)

    def begin_abort(self) -> None:
        self._require_transactional("abort_transaction")
        if self.state is S.FATAL_ERROR:
            self._raise_if_failed()
        if self.state not in (S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION):
            raise IllegalStateError(f"abort_transaction in state {self.state.value}")
        self._transition(S.ABORTING_TRANSACTION)

    @property
    def needs_end_call(self) -> bool:
        """Whether the coordinator has a transaction to end (docs/design.md: the SDK sends no
        commit or abort for a transaction that added nothing)."""
        return self.started_at_coordinator

    @property
    def confirmed_at_coordinator(self) -> bool:
        """Whether the coordinator certainly holds a transaction: something was
        confirmed added (under version 2, a batch acknowledged: its node added it)."""
        if self.nodes_add_partitions:
            return bool(self.opened or self.groups)
        return bool(self.partitions or self.groups)

    def on_init_version(self, transaction_version: int) -> None:
        """The protocol the coordinator's init answer agreed to."""
        self.transaction_version = transaction_version

    def complete_end(self, next_ids: tuple[int, int] | None = None) -> bool:
        """Commit or abort is done at the coordinator; True when the producer goes on at
        a new epoch (or id), so every partition's sequence restarts at 0.

        ``next_ids`` is the (id, epoch) a version-2 end answered. The bump it made fences
        everything of the ended transaction, which is what a KIP-360 bump after an abort
        would do: none is needed after it.
        """
        self._clear_transaction()
        bumped = (
            next_ids is not None
            and self.nodes_add_partitions
            and next_ids != (self.producer_id, self.producer_epoch)
        )
        if bumped:
            assert next_ids is not None
            self.producer_id, self.producer_epoch = next_ids
            self.epoch_bump_required = False
        if self.state is S.ABORTING_TRANSACTION and self.epoch_bump_required:
            self.begin_epoch_bump()
        else:
            self._transition(S.READY)
            self.last_error = None
        return bumped

    # --- errors --------------------------------------------------------------------------

    def on_error(self, exc: BaseException) -> None:
        """Record an error from any request: fatal errors end the producer; for a
        transactional producer the others make the transaction abortable."""
        if breaks_sequence(exc):
            self.epoch_bump_required = True
        if isinstance(exc, FatalError):
            self.to_fatal(exc)
        elif self.transactional and isinstance(exc, AbortableError | DeliveryTimeoutError):
            self.to_abortable(exc)

    def to_abortable(self, exc: BaseException) -> None:
        if self.state in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR):
            self.last_error = exc
            self._transition(S.ABORTABLE_ERROR)
        elif self.state is S.ABORTING_TRANSACTION and self.last_error is None:
            self.last_error = exc

    def to_fatal(self, exc: BaseException) -> None:
        self.last_error = exc
        self.state = S.FATAL_ERROR
