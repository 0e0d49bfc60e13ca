"""The producer's logic without I/O, shared by the sync and async twins.

``ProducerCore`` joins the state machine (``_state``), the accumulator (``_accumulator``)
and the metadata cache, and answers two questions for the sender of either twin: what to
send now (``next_actions``), and what an answer means (``on_*``). The twins only move
bytes, wait, and wake each other up; every decision is made here, once. The order of
each call's requests and what its errors do to the state are the sequences of
``sdk._txn_calls``, built on this object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from eos_protocol.coordinator import TRANSACTION_VERSION_1
from eos_protocol.errors import (
    AbortableError,
    FatalError,
    UnknownTopicOrPartitionError,
    error_for,
)
from sdk._accumulator import (
    MAX_REQUEST_BYTES,
    FutureLike,
    Partitioner,
    ProducerBatch,
    RecordAccumulator,
)
from sdk._config import ProducerConfig
from sdk._errors import (
    EosTimeoutError,
    ProducerClosedError,
    TransactionAbortedError,
    copy_error,
)
from sdk._metadata import MetadataCache
from sdk._record_futures import RecordFuturesBase
from sdk._state import ProducerState, TransactionManager
from sdk._transport import POLICIES, UNKNOWN_OUTCOME, Req, Verdict, backoff_s, classify
from sdk._types import (
    OffsetAndMetadata,
    Offsets,
    Payload,
    RecordMetadata,
    TopicPartition,
    as_offset,
)
from sdk._types import as_topic_partition as _tp

_PAYLOAD_TYPES = (str, bytes)
_new_tuple = tuple.__new__


#: How long a produce attempt may go unanswered before the sender looks its partitions'
#: leaders up again, and how often it looks while the attempt stays unanswered. A leader
#: that is paused (SIGSTOP, a stalled disk) or cut off accepts the connection, or holds
#: it, and answers nothing; the cluster elects another leader within its node session
#: timeout (2 s by default). Without a look the producer would wait out its request
#: timeout (30 s) on the silent one, where a dead leader costs seconds.
LEADER_CHECK_S = 1.0


class LeaderMovedError(httpx.TransportError):
    """A produce attempt given up because its partitions are led elsewhere now. Its
    outcome is unknown, as after a timeout: the batches go again, to the new leader, with
    the same sequence numbers, so a copy that did land is recognised as a duplicate."""


#: How long a node that knew no multi-partition produce is sent one batch per request
#: before it is asked again (it may have been upgraded meanwhile).
SINGLE_BATCHES_FOR_S = 60.0


def now_ms() -> int:
    return int(time.monotonic() * 1000)


#: A request body, or a function giving the body of each attempt.
Body = dict[str, Any] | Callable[[], dict[str, Any]]


@dataclass
class Actions:
    """What the sender should do now."""

    init_producer_id: bool = False
    add_partitions: list[TopicPartition] = field(default_factory=list)
    batches: list[ProducerBatch] = field(default_factory=list)
    #: ``batches`` as requests: (the node's URL, the batches of several partitions it
    #: leads) for one ``POST /v1/produce``, or (None, [one batch]) for its own request.
    requests: list[tuple[str | None, list[ProducerBatch]]] = field(default_factory=list)
    wake_at_ms: int | None = None

    @property
    def empty(self) -> bool:
        return not (self.init_producer_id or self.add_partitions or self.batches)


class ProducerCore:
    """Everything a producer decides. Not thread-safe: the sync twin holds a lock."""

    def __init__(
        self,
        config: ProducerConfig,
        batch_future: Callable[[], FutureLike[None]],
        *,
        defer_settle: bool = False,
    ) -> None:
        """``defer_settle``: acknowledged batches' futures are not settled by
        ``on_produce_ok`` but queued for ``take_settlements``, which the sync twin runs
        outside its lock."""
        self.config = config
        self.defer_settle = defer_settle
        self._settlements: list[Callable[[], None]] = []
        self.txn = TransactionManager(config.transactional_id)
        self.metadata = MetadataCache(config.bootstrap_url)
        self.partitioner = Partitioner()
        self.accumulator = RecordAccumulator(
            batch_size=config.batch_size,
            linger_ms=config.linger_ms,
            max_in_flight=config.max_in_flight,
            delivery_timeout_ms=config.delivery_timeout_ms,
            backoff=lambda exc, attempt: backoff_s(exc, attempt, config.retry),
            batch_future=batch_future,
            max_request_bytes=max(MAX_REQUEST_BYTES, config.batch_size),
        )
        self.closed = False
        self.init_in_flight = False
        #: Nodes sent one batch per request until then (``single_batches_to``).
        self._single_until: dict[str, float] = {}
        self._leaders_checked: dict[str, float] = {}  # topic -> when last looked up
        #: The transaction version init asks for: the configured one, or the highest the
        #: cluster speaks too, decided at init (``sdk._versions``).
        self.init_version = config.transaction_version or TRANSACTION_VERSION_1

    @property
    def transactional(self) -> bool:
        return self.txn.transactional

    @property
    def state(self) -> ProducerState:
        return self.txn.state

    # --- send ----------------------------------------------------------------------------

    def check_send(self) -> None:
        if self.closed:
            raise ProducerClosedError("the producer is closed")
        self.txn.ensure_can_send()

    def choose_partition(
        self, topic: str, key: Payload | None, partition: int | None
    ) -> TopicPartition:
        """The record's partition (metadata for ``topic`` must be cached)."""
        count = self.metadata.partition_count(topic)
        assert count is not None
        if partition is not None:
            if not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"{topic} has {count} partitions; there is no partition {partition}"
                )
            return TopicPartition(topic, partition)
        return TopicPartition(topic, self.partitioner.partition(topic, key, count))

    def append(
        self,
        tp: TopicPartition,
        key: Payload | None,
        value: Payload | None,
        headers: dict[str, str] | None,
        timestamp_ms: int | None,
        future: FutureLike[RecordMetadata],
        keyless: bool,
    ) -> bool:
        """Queue a record; True if the sender should look at the queues again now."""
        if key is not None and not isinstance(key, _PAYLOAD_TYPES):
            raise TypeError("a key is str, bytes or None")
        if value is not None and not isinstance(value, _PAYLOAD_TYPES):
            raise TypeError("a value is str, bytes or None")
        txn = self.txn
        new_partition = False
        if txn.transactional:
            new_partition = tp not in txn.partitions and (
                tp not in txn.pending and tp not in txn.adding
            )
            txn.maybe_add_partition(tp)
        new_batch = self.accumulator.append(tp, key, value, headers, timestamp_ms, future, now_ms())
        if new_batch and keyless:
            count = self.metadata.partition_count(tp.topic) or 1
            self.partitioner.on_new_batch(tp.topic, tp.partition, count)
        return new_batch or new_partition or self.accumulator.last_closed

    def buffer_full(self) -> bool:
        """The records queued and unacknowledged fill ``buffer_memory``: a send waits."""
        return self.accumulator.buffered_bytes >= self.config.buffer_memory

    def buffer_timeout(self) -> EosTimeoutError:
        """What a send raises when the buffer stayed full for ``max_block_ms``."""
        return EosTimeoutError(
            f"the producer's buffer ({self.config.buffer_memory} bytes) stayed full for "
            f"max_block_ms ({self.config.max_block_ms} ms)"
        )

    def try_append(
        self,
        topic: str,
        value: Payload | None,
        key: Payload | None,
        partition: int | None,
        headers: dict[str, str] | None,
        timestamp_ms: int | None,
        future: FutureLike[RecordMetadata],
    ) -> bool | None:
        """``send`` when the topic's metadata is cached, without the generator of
        ``sdk._txn_calls.send`` (the same steps, which then need no I/O): True if the
        sender should look at the queues now; None if the topic must be looked up first
        (the caller runs the full sequence)."""
        self.check_send()
        count = self.metadata.partition_count(topic)
        if count is None:
            return None
        if partition is None:
            p = self.partitioner.partition(topic, key, count)
            tp: TopicPartition = _new_tuple(TopicPartition, (topic, p))
        else:
            tp = self.choose_partition(topic, key, partition)
        return self.append(
            tp, key, value, headers, timestamp_ms, future, key is None and partition is None
        )

    def append_many(
        self,
        topic: str,
        values: Sequence[Payload | None],
        keys: Sequence[Payload | None] | None,
        partition: int | None,
        headers: dict[str, str] | None,
        timestamp_ms: int | None,
        futures: RecordFuturesBase[Any],
    ) -> bool:
        """Queue a list of records, as ``send`` would one after the other (same
        partitions, same order within each), in one call; ``futures`` settles them.
        Every record is checked before any is queued, so a refused list leaves nothing
        behind. Returns False if the topic must be looked up first."""
        self.check_send()
        count = self.metadata.partition_count(topic)
        if count is None:
            return False
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        for value in values:
            if value is not None and not isinstance(value, str | bytes):
                raise TypeError("a value is str, bytes or None")
        for key in keys or ():
            if key is not None and not isinstance(key, str | bytes):
                raise TypeError("a key is str, bytes or None")
        now = now_ms()
        extend = self.accumulator.extend
        if partition is not None:
            tp = self.choose_partition(topic, None, partition)
            self.txn.maybe_add_partition(tp)
            extend(tp, keys, values, headers, timestamp_ms, futures, 0, now,
                   until_new_batch=False)
        elif keys is None:
            # Keyless: the sticky partition takes records until a batch is opened, then
            # the partitioner moves on, exactly as for records sent one by one.
            i, n = 0, len(values)
            while i < n:
                tp = TopicPartition(topic, self.partitioner.partition(topic, None, count))
                self.txn.maybe_add_partition(tp)
                i, opened = extend(tp, None, values, headers, timestamp_ms, futures, i, now,
                                   until_new_batch=True)
                if opened:
                    self.partitioner.on_new_batch(topic, tp.partition, count)
        else:
            # Keyed: each run of consecutive records bound for one partition goes in at
            # once (a None key among them takes the sticky partition, as with ``send``).
            for partition_index, start, stop in self._runs(topic, keys, count):
                tp = TopicPartition(topic, partition_index)
                self.txn.maybe_add_partition(tp)
                extend(tp, keys, values, headers, timestamp_ms, futures, start, now,
                       until_new_batch=False, stop=stop)
        return True

    def _runs(
        self, topic: str, keys: Sequence[Payload | None], count: int
    ) -> list[tuple[int, int, int]]:
        """(partition, start, stop) of each run of consecutive keys of one partition."""
        runs: list[tuple[int, int, int]] = []
        partition_of = self.partitioner.partition
        for i, key in enumerate(keys):
            p = partition_of(topic, key, count)
            if runs and runs[-1][0] == p and runs[-1][2] == i:
                runs[-1] = (p, runs[-1][1], i + 1)
            else:
                runs.append((p, i, i + 1))
        return runs

    def take_settlements(self) -> list[Callable[[], None]]:
        """The acknowledged batches whose futures are still to settle (``defer_settle``)."""
        out, self._settlements = self._settlements, []
        return out

    # --- the sender's questions ----------------------------------------------------------

    def next_actions(self) -> Actions:
        now = now_ms()
        actions = Actions()
        txn = self.txn
        if txn.state in (ProducerState.ABORTABLE_ERROR, ProducerState.FATAL_ERROR):
            assert txn.last_error is not None
            dropped = self.accumulator.abort_unsent(
                TransactionAbortedError(f"the transaction cannot commit: {txn.last_error!r}")
                if txn.state is ProducerState.ABORTABLE_ERROR
                else copy_error(txn.last_error)
            )
            txn.epoch_bump_required = txn.epoch_bump_required or dropped
        hold_new = False
        if not self.transactional:
            if self.accumulator.sequence_broken and txn.has_producer_id:
                # KIP-360 for a producer without transactions: once nothing is in flight,
                # take a new producer id so every partition restarts at sequence 0. Until
                # then, batches in flight or awaiting a retry are resolved, no new one goes.
                if self.accumulator.in_flight_count() == 0 and not self.init_in_flight:
                    txn.reset_producer_id()
                else:
                    hold_new = True
            if not txn.has_producer_id or txn.state is ProducerState.UNINITIALIZED:
                self.accumulator.expire(now)  # records must not wait forever for an id
                if self.accumulator.has_unsent() and not self.init_in_flight:
                    actions.init_producer_id = True
                    self.init_in_flight = True
                return actions
        else:
            actions.add_partitions = txn.partitions_to_add()
        if txn.state is ProducerState.INITIALIZING:
            return actions
        limit = (lambda tp, most: 0) if hold_new else txn.in_flight_limit
        actions.batches, actions.wake_at_ms = self.accumulator.drain(
            now, limit, txn.producer_id, txn.producer_epoch
        )
        actions.requests = self.requests_for(actions.batches)
        return actions

    def requests_for(
        self, batches: list[ProducerBatch]
    ) -> list[tuple[str | None, list[ProducerBatch]]]:
        """The batches drained together, grouped by their leader node: one request per
        node carries them all (Kafka's Produce request), up to ``max_request_bytes``. A
        batch goes alone, to its partition's path, when it is its node's only one, when
        its leader must be looked up first, or when the node is of an earlier release."""
        by_node: dict[str, list[ProducerBatch]] = {}
        alone: list[ProducerBatch] = []
        now = time.monotonic()
        for batch in batches:
            try:
                url = self.metadata.leader(batch.tp)
            except Exception:
                url = None  # the single produce meets the error again, and handles it
            if url is None or self._single_until.get(url, 0.0) > now:
                alone.append(batch)
            else:
                by_node.setdefault(url, []).append(batch)
        requests: list[tuple[str | None, list[ProducerBatch]]] = [(None, [b]) for b in alone]
        most = self.accumulator.max_request_bytes or MAX_REQUEST_BYTES
        for url, group in by_node.items():
            chunk: list[ProducerBatch] = []
            size = 0
            for batch in group:
                if chunk and size + batch.size > most:
                    requests.append((url, chunk) if len(chunk) > 1 else (None, chunk))
                    chunk, size = [], 0
                chunk.append(batch)
                size += batch.size
            requests.append((url, chunk) if len(chunk) > 1 else (None, chunk))
        return requests

    def leaders_check_due(self, topic: str) -> bool:
        """Whether ``topic``'s leaders may be looked up again for a silent attempt (not
        within the last half of ``LEADER_CHECK_S``); if so, the lookup counts from now."""
        now = time.monotonic()
        if now - self._leaders_checked.get(topic, float("-inf")) < LEADER_CHECK_S / 2:
            return False
        self._leaders_checked[topic] = now
        return True

    def led_elsewhere(self, url: str, batches: Iterable[ProducerBatch]) -> bool:
        """Whether a partition of ``batches``, sent to ``url``, has another leader now
        (after ``refresh_leaders``); a partition with no leader for the moment has not
        moved yet."""
        for batch in batches:
            try:
                leader = self.metadata.leader(batch.tp)
            except Exception:
                continue
            if leader is not None and not url.startswith(leader):
                return True
        return False

    def single_batches_to(self, url: str) -> None:
        """The node at ``url`` knows no multi-partition produce (an earlier release): send
        it one batch per request, and ask again in ``SINGLE_BATCHES_FOR_S``."""
        self._single_until[url] = time.monotonic() + SINGLE_BATCHES_FOR_S

    def on_producer_id(self, body: dict[str, Any]) -> None:
        """An idempotent producer's id (``POST /v1/producers``)."""
        self.init_in_flight = False
        if self.txn.state is ProducerState.UNINITIALIZED:
            self.txn.begin_init()
        self.txn.complete_init(int(body["producer_id"]), int(body["producer_epoch"]))
        self.accumulator.reset_sequences()

    def on_producer_id_failed(self, exc: BaseException) -> None:
        self.init_in_flight = False
        if isinstance(exc, FatalError):
            self.txn.to_fatal(exc)

    def add_partitions_body(self, tps: list[TopicPartition]) -> dict[str, Any]:
        """The body of an add-partitions attempt: ``tps`` grows with the partitions that
        became pending since the call began (a retry after CONCURRENT_TRANSACTIONS)."""
        tps.extend(self.txn.take_pending())
        return {
            **self.end_body(),
            "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in tps],
        }

    def on_add_result(self, tps: list[TopicPartition], body: dict[str, Any]) -> None:
        ok: list[TopicPartition] = []
        for result in body.get("partitions", []):
            tp = TopicPartition(str(result["topic"]), int(result["partition"]))
            if result.get("error"):
                self.txn.on_error(error_for(str(result["error"]), f"adding {tp} failed"))
            else:
                ok.append(tp)
        missing = set(tps) - set(ok)
        self.txn.on_partitions_added(ok)
        self.txn.on_add_failed(sorted(missing), retry=False)

    def on_add_failed(self, tps: list[TopicPartition], exc: BaseException) -> None:
        self.txn.on_add_failed(tps, retry=False)
        self.on_request_error(exc)

    def on_request_error(self, exc: BaseException) -> None:
        """A coordinator request failed for good: fatal stays fatal, anything else makes
        the transaction abortable (Kafka treats an exhausted retry the same way)."""
        self.txn.on_error(exc)
        if not isinstance(exc, FatalError | AbortableError) and self.transactional:
            self.txn.to_abortable(exc)

    def on_wire(self, batch: ProducerBatch) -> None:
        """The batch's request is written: the partition's next batch may go."""
        batch.on_wire = True

    def on_produce_ok(self, batch: ProducerBatch, body: dict[str, Any]) -> None:
        settle = self.accumulator.complete(batch, body, settle=not self.defer_settle)
        if self.defer_settle:
            self._settlements.append(settle)
        self.txn.on_batch_acked(batch.tp)

    def on_produce_error(self, batch: ProducerBatch, exc: BaseException) -> None:
        verdict = classify(POLICIES[Req.PRODUCE], exc)
        if verdict is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME):
            self.metadata.invalidate_topic(batch.tp.topic)
        final = self.accumulator.failed(batch, exc, now_ms())
        if final is not None:
            self.txn.on_error(final)
            if self.transactional and not isinstance(final, FatalError):
                self.txn.to_abortable(final)

    # --- commit / abort ------------------------------------------------------------------

    def begin_flush(self) -> list[FutureLike[None]]:
        self.accumulator.flushing = True
        return self.accumulator.pending_done()

    def end_flush(self) -> None:
        self.accumulator.flushing = False

    def begin_abort(self) -> None:
        self.txn.begin_abort()
        if self.accumulator.abort_unsent(TransactionAbortedError("the transaction was aborted")):
            self.txn.epoch_bump_required = True
        self.txn.pending.clear()

    def commit_outcome(self) -> None:
        """After the flush: refuse the commit if a batch failed."""
        if self.txn.state in (ProducerState.ABORTABLE_ERROR, ProducerState.FATAL_ERROR):
            assert self.txn.last_error is not None
            raise copy_error(self.txn.last_error)

    def end_body(self) -> dict[str, Any]:
        return {"producer_id": self.txn.producer_id, "producer_epoch": self.txn.producer_epoch}

    def init_body(self, bump: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"transaction_timeout_ms": self.config.transaction_timeout_ms}
        if bump and self.txn.has_producer_id:
            body.update(producer_id=self.txn.producer_id, producer_epoch=self.txn.producer_epoch)
        return body

    def on_init(self, body: dict[str, Any]) -> None:
        self.txn.complete_init(int(body["producer_id"]), int(body["producer_epoch"]))
        self.accumulator.reset_sequences()

    def txn_offsets_body(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> dict[str, Any]:
        assert self.txn.transactional_id is not None
        return {
            "transactional_id": self.txn.transactional_id,
            "producer_id": self.txn.producer_id,
            "producer_epoch": self.txn.producer_epoch,
            "offsets": offsets_json(offsets),
        }


def normalise_offsets(offsets: Offsets) -> dict[TopicPartition, OffsetAndMetadata]:
    return {_tp(tp): as_offset(value) for tp, value in offsets.items()}


def offsets_json(offsets: dict[TopicPartition, OffsetAndMetadata]) -> list[dict[str, Any]]:
    return [
        {"topic": tp.topic, "partition": tp.partition, "offset": om.offset, "metadata": om.metadata}
        for tp, om in sorted(offsets.items())
    ]
