"""The transaction coordinator proper: init, add partitions/offsets, commit and abort.

Kafka's model: the owner of a transaction-log partition keeps every record of that
partition in memory and serialises the requests of each transactional id through a lock.
A request reads the cached record, asks ``state.py``/``decide`` for the next one, makes it
durable with a lease-fenced write (``store.py``) and only then updates the cache and
answers — prepare, durable write, complete. A write that matches no row means the lease has
moved on: the partition is dropped here and the client is told NOT_COORDINATOR.

Commit and abort write Prepare*, hand the markers to the channel and answer (or, with
``wait_for_markers``, wait for Complete*). ``init`` on an Ongoing transaction fences its
producer by writing PrepareAbort at epoch + 1, waits a little for that abort to complete and
then bumps the epoch for the new producer; if the abort takes longer it answers
CONCURRENT_TRANSACTIONS and the client retries.

Transaction version 2 (KIP-890 part 2, chosen by the producer's ``init``): a storage node
adds a partition on the transaction's first batch there (``add_for_producer``, the same
add as the client's), and every commit or abort bumps the epoch in its Prepare* write
(``st.prepare_end``), handing out a new producer id when the epoch runs out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coordinator_service.clock import Clock
from coordinator_service.cluster.leases import LeaseManager
from coordinator_service.controller.metadata import Metadata
from coordinator_service.db.engine import Database
from coordinator_service.groups.fencing import GroupFence
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions import state as st
from coordinator_service.transactions.batcher import WriteBatcher
from coordinator_service.transactions.markers import MarkerChannel, MarkerJob
from coordinator_service.transactions.producer_ids import ProducerIdManager
from coordinator_service.transactions.state import EndResult, TopicPartitionKey, TxnRecord
from coordinator_service.transactions.store import LeaseToken, TransactionStore
from coordinator_service.transactions.table import Outcome, TxnEvent, decide
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from eos_protocol.coordinator import (
    AddOffsetsRequest,
    AddPartitionsRequest,
    InitTransactionsRequest,
    PartitionResult,
)
from eos_protocol.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NotCoordinatorError,
    TransactionalIdNotFoundError,
    UnknownProducerIdError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.node import MarkerResult
from eos_protocol.partitioning import group_offsets_partition
from eos_protocol.states import TransactionState
from eos_server.logs import txn_fields

log = logging.getLogger("eos.coordinator.transactions")

#: The most a partition being handed over waits for its requests and markers in flight.
HANDOFF_DRAIN_S = 2.0

# (transactional id, from state or None for a new id, to state, producer epoch)
TransitionListener = Callable[[str, TransactionState | None, TransactionState, int], None]


class TransactionCoordinator:
    """Owns the cached records of the leased log partitions and every change to them."""

    def __init__(
        self,
        *,
        db: Database,
        store: TransactionStore,
        writer: WriteBatcher,
        markers: MarkerChannel,
        producer_ids: ProducerIdManager,
        metadata: Metadata,
        metrics: CoordinatorMetrics,
        clock: Clock,
        lease_clock: Clock,
        log_partitions: int,
        max_timeout_ms: int,
        init_wait_ms: int,
    ) -> None:
        self._db = db
        self._store = store
        self._writer = writer
        self.markers = markers
        self._pids = producer_ids
        self._metadata = metadata
        self._metrics = metrics
        self._clock = clock
        self._lease_clock = lease_clock
        self._log_partitions = log_partitions
        self._max_timeout_ms = max_timeout_ms
        self._init_wait_s = init_wait_ms / 1000
        self.leases: LeaseManager | None = None  # set by the app once both exist
        self.fence: GroupFence | None = None  # set by the app (group offsets, KIP-447)
        self.cache: dict[int, dict[str, TxnRecord]] = {}
        # producer id -> transactional id of the cached records (KIP-890's verification)
        self._by_producer: dict[int, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.listeners: list[TransitionListener] = []

    # --- helpers -------------------------------------------------------------------------

    def partition_of(self, transactional_id: str) -> int:
        return st.txn_log_partition(transactional_id, self._log_partitions)

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    async def _owned(self, transactional_id: str) -> tuple[LeaseToken, dict[str, TxnRecord]]:
        assert self.leases is not None
        token = await self.leases.require(self.partition_of(transactional_id))
        return token, self.cache.setdefault(token.log_partition, {})

    def _emit(self, tid: str, old: TransactionState | None, new: TxnRecord) -> None:
        if old is not new.state:
            self._announce(tid, old, new.state, new.producer_epoch, new.producer_id)

    def _announce(
        self,
        tid: str,
        old: TransactionState | None,
        new: TransactionState,
        epoch: int,
        producer_id: int,
    ) -> None:
        log.debug(
            "%s: %s -> %s", tid, old.value if old else "new", new.value,
            extra=txn_fields(tid, producer_id, epoch, from_state=old.value if old else None,
                             to_state=new.value),
        )
        self._metrics.transition(old, new)
        for listener in self.listeners:
            listener(tid, old, new, epoch)

    def _cache_put(self, records: dict[str, TxnRecord], new: TxnRecord) -> None:
        """Cache a durable record and keep the producer-id index in step with it (the
        new id of a pending version-2 rollover is indexed too: nodes add for it)."""
        old = records.get(new.transactional_id)
        if old is not None:
            for pid in st.producer_ids_of(old) - st.producer_ids_of(new):
                if self._by_producer.get(pid) == new.transactional_id:
                    del self._by_producer[pid]
        records[new.transactional_id] = new
        for pid in st.producer_ids_of(new):
            self._by_producer[pid] = new.transactional_id

    def _cache_drop(self, records: dict[str, TxnRecord]) -> None:
        for rec in records.values():
            for pid in st.producer_ids_of(rec):
                if self._by_producer.get(pid) == rec.transactional_id:
                    del self._by_producer[pid]

    async def _write(self, old: TxnRecord | None, new: TxnRecord, token: LeaseToken) -> None:
        """Make ``new`` durable under ``token``, then cache it (the only path to a change)."""
        new = new.replace(coordinator_epoch=token.coordinator_epoch)
        if not await self._writer.write(new, token, insert=old is None):
            await self._lost(token)
        self._cache_put(self.cache.setdefault(token.log_partition, {}), new)
        self._emit(new.transactional_id, old.state if old else None, new)

    def cached_producer(self, producer_id: int) -> TxnRecord | None:
        """The record of ``producer_id`` from memory, if memory is authoritative for it.

        Every cached record was durable before it was cached, and while this instance
        holds the lease of the record's log partition nobody else can change its row, so
        the cached record is the row. ``None`` (ask the database) when the producer id is
        not cached here or the lease may have lapsed by the local lease clock.
        """
        assert self.leases is not None
        tid = self._by_producer.get(producer_id)
        if tid is None:
            return None
        partition = self.partition_of(tid)
        if self.leases.live_token(partition) is None:
            return None
        rec = self.cache.get(partition, {}).get(tid)
        if rec is None or producer_id not in st.producer_ids_of(rec):
            return None
        return rec

    async def producer_record(self, producer_id: int) -> TxnRecord | None:
        """The record holding ``producer_id``: from memory when authoritative, else the
        database (any instance can answer KIP-890's verification this way)."""
        rec = self.cached_producer(producer_id)
        if rec is None:
            rec = await self._db.run(self._store.find_by_producer, producer_id)
        return rec

    async def _lost(self, token: LeaseToken) -> None:
        assert self.leases is not None
        await self.leases.drop(token.log_partition, token.coordinator_epoch)
        raise NotCoordinatorError(f"lease on transaction log partition {token.log_partition} "
                                  "was lost")

    def _job_for(self, rec: TxnRecord, token: LeaseToken) -> MarkerJob:
        pending: dict[int, set[TopicPartitionKey]] = {}
        for topic, partition in rec.partitions:
            node = self._metadata.cached_leader(topic, partition)
            if node is not None:
                pending.setdefault(node, set()).add((topic, partition))
        commit = rec.state is TransactionState.PREPARE_COMMIT
        job = MarkerJob(
            transactional_id=rec.transactional_id, token=token, producer_id=rec.producer_id,
            producer_epoch=rec.producer_epoch,
            result=MarkerResult.COMMIT if commit else MarkerResult.ABORT, pending=pending,
            created_ms=self._clock.now_ms(),
        )
        return self.markers.submit(job)

    def ensure_markers(self, rec: TxnRecord) -> MarkerJob | None:
        """The marker job of a Prepare* record, queued again if it is not in flight."""
        assert self.leases is not None
        token = self.leases.token(rec.txn_log_partition)
        if token is None or not rec.state.is_prepare:
            return None
        return self._job_for(rec, token)

    # --- lease callbacks -----------------------------------------------------------------

    async def load(self, token: LeaseToken) -> None:
        """Take over a log partition: load its records and resume unfinished markers."""
        records = await self._db.run(self._store.load_partition, token.log_partition)
        await self._metadata.refresh()
        cached: dict[str, TxnRecord] = {}
        for rec in records:
            self._cache_put(cached, rec)
        self.cache[token.log_partition] = cached
        for rec in records:
            if rec.state.is_prepare:
                self._job_for(rec, token)

    async def hand_off(self, log_partition: int, budget_s: float = HANDOFF_DRAIN_S) -> None:
        """Finish what is under way on a partition being handed over, then unload it.

        New requests are refused by the lease manager by now; the ones holding a
        transactional id's lock complete first, and markers in flight get a moment to be
        acknowledged (the next owner then sends fewer again), all within ``budget_s``:
        the lease round waits for this. The caller releases the lease afterwards; writes
        stay fenced in SQL, so what still runs past the budget can change nothing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        for tid, lock in list(self._locks.items()):
            if self.partition_of(tid) != log_partition:
                continue
            try:
                await asyncio.wait_for(lock.acquire(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
            lock.release()
        await self.markers.drain(log_partition, max(0.0, deadline - loop.time()))
        await self.unload(log_partition)

    async def unload(self, log_partition: int) -> None:
        self._cache_drop(self.cache.pop(log_partition, {}))
        self.markers.abandon(log_partition)

    # --- init ----------------------------------------------------------------------------

    async def init(self, tid: str, req: InitTransactionsRequest) -> tuple[int, int]:
        if not 1 <= req.transaction_timeout_ms <= self._max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout {req.transaction_timeout_ms} ms is not within "
                f"1..{self._max_timeout_ms} ms"
            )
        if (req.producer_id is None) != (req.producer_epoch is None):
            raise InvalidProducerEpochError("give both producer_id and producer_epoch, or neither")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._init_wait_s
        first = True
        while True:
            async with self._lock(tid):
                token, records = await self._owned(tid)
                rec = records.get(tid)
                if rec is None:
                    if req.producer_id is not None:
                        raise InvalidProducerIdMappingError(
                            f"transactional id {tid!r} has no producer {req.producer_id}"
                        )
                    pid = await self._pids.next_id()
                    new = st.new_record(
                        tid, token.log_partition, pid, req.transaction_timeout_ms,
                        self._clock.now_ms(), token.coordinator_epoch,
                        req.transaction_version,
                    )
                    await self._write(None, new, token)
                    return new.producer_id, new.producer_epoch
                if first and req.producer_id is not None:
                    assert req.producer_epoch is not None
                    if self._is_init_retry(rec, req.producer_id, req.producer_epoch):
                        return rec.producer_id, rec.producer_epoch
                    st.check_producer(rec, req.producer_id, req.producer_epoch)
                first = False
                decision = decide(rec.state, TxnEvent.INIT, last_decision_matches=False)
                if decision.outcome is Outcome.BUMP_EPOCH:
                    new_pid = await self._pids.next_id() if st.needs_new_producer_id(rec) else None
                    new = st.bump_for_init(
                        rec, self._clock.now_ms(), new_pid, req.transaction_version
                    ).replace(timeout_ms=req.transaction_timeout_ms)
                    await self._write(rec, new, token)
                    return new.producer_id, new.producer_epoch
                if decision.outcome is Outcome.INVALID:
                    raise InvalidTxnStateError(f"transactional id {tid!r} is {rec.state.value}")
                job: MarkerJob | None
                if decision.outcome is Outcome.FENCE_AND_ABORT:
                    job = await self._fence(rec, token)
                else:  # CONCURRENT: a Prepare* record is completing
                    job = self.ensure_markers(rec)
            remaining = deadline - loop.time()
            if job is None or remaining <= 0:
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r} is completing its previous transaction"
                )
            try:
                await asyncio.wait_for(asyncio.shield(job.done), remaining)
            except TimeoutError:
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r} is completing its previous transaction"
                ) from None

    @staticmethod
    def _is_init_retry(rec: TxnRecord, producer_id: int, producer_epoch: int) -> bool:
        """KIP-360: an init naming the epoch this id had before its last bump is a retry
        whose answer was lost; it gets the current id and epoch without another bump."""
        return (
            (producer_id, producer_epoch) == (rec.last_producer_id, rec.last_producer_epoch)
            and rec.state is not TransactionState.ONGOING
        )

    async def _fence(self, rec: TxnRecord, token: LeaseToken) -> MarkerJob:
        """Ongoing -> (PrepareEpochFence) -> PrepareAbort at epoch + 1, markers queued."""
        fenced = st.fence_and_prepare_abort(rec, self._clock.now_ms())
        log.info(
            "fencing producer %d of %r: epoch %d is bumped and its transaction aborted",
            rec.producer_id, rec.transactional_id, rec.producer_epoch,
            extra=txn_fields(rec.transactional_id, rec.producer_id, rec.producer_epoch),
        )
        self._announce(rec.transactional_id, rec.state, TransactionState.PREPARE_EPOCH_FENCE,
                       rec.producer_epoch, rec.producer_id)
        await self._write(rec.replace(state=TransactionState.PREPARE_EPOCH_FENCE), fenced, token)
        return self._job_for(fenced, token)

    # --- add partitions / offsets --------------------------------------------------------

    async def add_partitions(self, tid: str, req: AddPartitionsRequest) -> list[PartitionResult]:
        results: list[PartitionResult] = []
        valid: list[TopicPartitionKey] = []
        for tp in req.partitions:
            known = await self._metadata.leader(tp.topic, tp.partition) is not None
            if known:
                valid.append((tp.topic, tp.partition))
            results.append(
                PartitionResult(
                    topic=tp.topic,
                    partition=tp.partition,
                    error=None if known else "UNKNOWN_TOPIC_OR_PARTITION",
                )
            )
        if valid:
            await self._add(tid, req.producer_id, req.producer_epoch, valid, [])
        return results

    async def add_offsets(self, tid: str, req: AddOffsetsRequest) -> None:
        partition = group_offsets_partition(req.group_id, self._metadata.offsets_partitions)
        await self._add(
            tid, req.producer_id, req.producer_epoch,
            [(CONSUMER_OFFSETS_TOPIC, partition)], [req.group_id], claim=req,
        )

    async def _add(
        self,
        tid: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartitionKey],
        groups: list[str],
        claim: AddOffsetsRequest | None = None,
    ) -> None:
        async with self._lock(tid):
            token, records = await self._owned(tid)
            rec = self._existing(records, tid, producer_id)
            st.check_producer(rec, producer_id, producer_epoch)
            decision = decide(rec.state, TxnEvent.ADD, last_decision_matches=False)
            if decision.outcome is Outcome.CONCURRENT:
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r} is completing its previous transaction "
                    f"({rec.state.value})"
                )
            if decision.outcome is Outcome.INVALID:
                raise InvalidTxnStateError(f"transactional id {tid!r} is {rec.state.value}")
            new = rec if st.adds_nothing(rec, partitions, groups) else st.add_partitions(
                rec, partitions, groups, self._clock.now_ms()
            )
            if claim is not None and self.fence is not None:  # KIP-447: before any write
                await self.fence.claim(tid, rec.producer_id, new.txn_start_ms or 0, claim)
            if new is not rec:
                await self._write(rec, new, token)

    async def add_for_producer(
        self, producer_id: int, producer_epoch: int, tp: TopicPartitionKey
    ) -> TxnRecord:
        """A storage node's add of the partition a batch is about to open a transaction on
        (transaction version 2); the record afterwards, for the node's own checks.

        The producer id leads to its transactional id (from memory or the database), and
        from there the add is the client's add-partitions: the owner alone writes
        (NOT_COORDINATOR elsewhere, naming the owner), the epoch is checked, a new
        transaction starts when none is open, and the add is durable before the answer.
        A version-1 producer adds its partitions itself, and a group's offsets partition
        is added by AddOffsetsToTxn: then the record is answered as it is, and the node
        verifies it as it does the GET's answer.
        """
        rec = await self.producer_record(producer_id)
        if rec is None:
            raise UnknownProducerIdError(f"no transactional id has producer id {producer_id}")
        if not rec.bumps_at_end or tp[0] == CONSUMER_OFFSETS_TOPIC:
            return rec  # the client adds its own partitions, or (offsets) AddOffsetsToTxn did
        if await self._metadata.leader(*tp) is None:
            raise UnknownTopicOrPartitionError(f"{tp[0]}-{tp[1]} is not a known partition")
        tid = rec.transactional_id
        await self._add(tid, producer_id, producer_epoch, [tp], [])
        _, records = await self._owned(tid)
        return records[tid]

    @staticmethod
    def _existing(records: dict[str, TxnRecord], tid: str, producer_id: int) -> TxnRecord:
        rec = records.get(tid)
        if rec is None:
            raise InvalidProducerIdMappingError(
                f"transactional id {tid!r} is unknown (call init first); "
                f"producer id {producer_id} is not mapped to it"
            )
        return rec

    # --- commit / abort ------------------------------------------------------------------

    async def end(
        self, tid: str, producer_id: int, producer_epoch: int, *, commit: bool, wait: bool
    ) -> EndResult:
        """Commit or abort. Under transaction version 2 the Prepare* write also bumps the
        epoch (``st.prepare_end``) and the answer names the id and epoch to go on with; an
        end repeated at the epoch it bumped is a retry whose answer was lost."""
        event = TxnEvent.COMMIT if commit else TxnEvent.ABORT
        async with self._lock(tid):
            token, records = await self._owned(tid)
            rec = self._existing(records, tid, producer_id)
            retry = st.is_end_retry(rec, producer_id, producer_epoch)
            if not retry:
                st.check_producer(rec, producer_id, producer_epoch)
            decision = decide(rec.state, event, last_decision_matches=rec.decision is event)
            if retry and decision.outcome is not Outcome.RETRY_SUCCESS:
                st.check_producer(rec, producer_id, producer_epoch)  # the other decision
            job: MarkerJob | None = None
            if decision.outcome is Outcome.TRANSITION:
                if commit and self.fence is not None:  # KIP-447: no commit by a zombie
                    await self.fence.verify_commit(tid, rec)
                new_pid = await self._pids.next_id() if st.end_exhausts_epoch(rec) else None
                new = st.prepare_end(rec, commit, self._clock.now_ms(), new_pid)
                await self._write(rec, new, token)
                job = self._job_for(new, token)
                state, ids = new.state, new.client_ids
            elif decision.outcome is Outcome.RETRY_SUCCESS:
                if rec.bumps_at_end and not retry:
                    # the current epoch only comes from an end that bumped it: that end
                    # decided this transaction, there is none to end at this epoch
                    raise InvalidTxnStateError(
                        f"cannot {event.value} transactional id {tid!r}: no transaction "
                        f"is open at epoch {producer_epoch}"
                    )
                job = self.ensure_markers(rec)
                state, ids = rec.state, rec.client_ids
            elif decision.outcome is Outcome.CONCURRENT:
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r} is being fenced; retry"
                )
            else:
                raise InvalidTxnStateError(
                    f"cannot {event.value} transactional id {tid!r} in state {rec.state.value}"
                )
        bumped = rec.bumps_at_end
        if not wait or job is None:
            return EndResult(state, *ids, bumped)
        if not await asyncio.shield(job.done):
            raise NotCoordinatorError(
                f"this instance lost transactional id {tid!r} before its markers completed"
            )
        final = self.cache.get(token.log_partition, {}).get(tid)
        if final is not None:
            state, ids = final.state, final.client_ids
        return EndResult(state, *ids, bumped)

    async def complete_jobs(self, jobs: list[MarkerJob]) -> list[bool]:
        """Write Complete* for jobs whose markers are all acknowledged, in one transaction."""
        now = self._clock.now_ms()
        writes: list[tuple[TxnRecord, LeaseToken]] = []
        index: list[int] = []
        results = [False] * len(jobs)
        for i, job in enumerate(jobs):
            rec = self.cache.get(job.token.log_partition, {}).get(job.transactional_id)
            if (
                rec is None
                or not rec.state.is_prepare
                or rec.producer_id != job.producer_id
                or rec.producer_epoch != job.producer_epoch
            ):
                continue
            new = st.complete(rec, now).replace(coordinator_epoch=job.token.coordinator_epoch)
            writes.append((new, job.token))
            index.append(i)
        if not writes:
            return results
        oks = await self._writer.write_many([(new, token, False) for new, token in writes])
        lost: set[tuple[int, int]] = set()
        for (new, token), i, ok in zip(writes, index, oks, strict=True):
            if not ok:
                lost.add((token.log_partition, token.coordinator_epoch))
                continue
            records = self.cache.get(token.log_partition)
            if records is None:
                continue
            old = records.get(new.transactional_id)
            self._cache_put(records, new)
            self._emit(new.transactional_id, old.state if old else None, new)
            results[i] = True
        assert self.leases is not None
        for p, epoch in sorted(lost):
            await self.leases.drop(p, epoch)
        return results

    # --- timeouts, expiry and admin ------------------------------------------------------

    async def abort_timed_out(self, tid: str, now_ms: int) -> bool:
        """Fence and abort an Ongoing transaction past its timeout (rechecked under lock)."""
        async with self._lock(tid):
            token, records = await self._owned(tid)
            rec = records.get(tid)
            if rec is None or not st.is_timed_out(rec, now_ms):
                return False
            log.info(
                "aborting timed-out transaction of %r (epoch %d)", tid, rec.producer_epoch,
                extra=txn_fields(tid, rec.producer_id, rec.producer_epoch,
                                 timeout_ms=rec.timeout_ms),
            )
            self._metrics.timeouts.inc()
            await self._fence(rec, token)
            return True

    async def expire(self, tid: str, now_ms: int, expiration_ms: int) -> bool:
        """Remove an id idle past ``transactional.id.expiration.ms`` (it becomes Dead)."""
        async with self._lock(tid):
            token, records = await self._owned(tid)
            rec = records.get(tid)
            if rec is None or not st.is_expired(rec, now_ms, expiration_ms):
                return False
            if not await self._db.run(self._store.delete, rec, token,
                                      self._lease_clock.now_ms()):
                await self._lost(token)
            del records[tid]
            if self._by_producer.get(rec.producer_id) == tid:
                del self._by_producer[rec.producer_id]
            self._locks.pop(tid, None)
            dead = rec.replace(state=TransactionState.DEAD)
            self._emit(tid, rec.state, dead)
            return True

    async def force_abort(self, tid: str) -> TransactionState:
        """KIP-664: abort a hanging transaction and fence its producer."""
        async with self._lock(tid):
            token, records = await self._owned(tid)
            rec = records.get(tid)
            if rec is None:
                raise TransactionalIdNotFoundError(f"unknown transactional id {tid!r}")
            if rec.state is TransactionState.ONGOING:
                await self._fence(rec, token)
                return TransactionState.PREPARE_ABORT
            if rec.state.is_prepare:
                self.ensure_markers(rec)
            return rec.state

    def open_transactions(self) -> int:
        return sum(
            1
            for records in self.cache.values()
            for rec in records.values()
            if rec.state is TransactionState.ONGOING or rec.state.is_prepare
        )

