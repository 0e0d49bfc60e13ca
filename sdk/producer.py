"""Blocking producers: ``TransactionalProducer`` and the idempotent ``Producer``.

Kafka's design: ``send`` only queues the record and returns a future; a sender thread
drains the batches (the decisions are ``ProducerCore``'s) and hands each request to a small
pool of worker threads, so up to ``max_in_flight`` batches per partition travel at once.
Every call that talks to the cluster is a sequence of ``sdk._txn_calls``, driven here by
``_drive`` with blocking I/O. The async twin in ``sdk.aio.producer`` drives the same
sequences with tasks instead of threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

import httpx

from eos_protocol.errors import FatalError
from sdk import _txn_calls as calls
from sdk._accumulator import FutureLike, ProducerBatch
from sdk._config import (
    DEFAULT_BATCH_SIZE,
    USE_DEFAULT,
    ProducerConfig,
    RetryConfig,
    TimeoutArg,
    resolve_timeout,
)
from sdk._errors import EosTimeoutError
from sdk._metadata import Bootstrap
from sdk._producer_base import (
    LEADER_CHECK_S,
    Actions,
    Body,
    LeaderMovedError,
    ProducerCore,
    now_ms,
)
from sdk._record_futures import RecordFuture, RecordFutures
from sdk._state import ProducerState
from sdk._transport import SyncTransport
from sdk._txn_calls import AwaitInFlight, Call, Flush, Produce, Step, Steps
from sdk._types import ConsumerGroupMetadata, Offsets, Payload, RecordMetadata

T = TypeVar("T")

_WORKERS = 32


class _SyncProducerBase:
    """The sender thread and the calls both producers share."""

    def __init__(self, config: ProducerConfig, transport: httpx.BaseTransport | None) -> None:
        self._config = config
        self._core = ProducerCore(config, batch_future=Future, defer_settle=True)
        self._http = SyncTransport(config.retry, transport=transport, headers=config.headers,
            token=config.token, ca_file=config.ca_file,
        )
        self._http.on_unreachable = self._core.metadata.unreachable
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the sender waits on it for work
        self._room = threading.Condition(lock)  # sends wait on it for buffer room
        self._futures_cond = threading.Condition()  # shared by the records' futures
        self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="eos-producer")
        # produce requests, watched from the pool (``_answer_or_moved``)
        self._io = ThreadPoolExecutor(_WORKERS, thread_name_prefix="eos-producer-io")
        self._add_future: Future[None] | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="eos-sender", daemon=True)
        self._thread.start()

    # --- public --------------------------------------------------------------------------

    @property
    def state(self) -> ProducerState:
        return self._core.state

    @property
    def producer_id(self) -> int:
        return self._core.txn.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._core.txn.producer_epoch

    def send(
        self,
        topic: str,
        value: Payload | None,
        key: Payload | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue a record; the future resolves to its ``RecordMetadata`` once acknowledged."""
        if self._core.buffer_full():  # read without the lock: a hint, checked under it
            self._wait_for_room()
        future: Future[RecordMetadata] = RecordFuture(self._futures_cond)
        with self._cond:
            wake = self._core.try_append(topic, value, key, partition, headers, timestamp_ms,
                                         future)
            if wake:
                self._cond.notify()
        if wake is None:  # the topic is not known yet: look it up, then queue
            steps = calls.send(
                self._core, topic, value, key, partition, headers, timestamp_ms, future
            )
            if self._drive(steps):
                self._wake()
        return future

    def send_many(
        self,
        topic: str,
        values: Sequence[Payload | None],
        keys: Sequence[Payload | None] | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFutures:
        """Queue a list of records in one call: as many ``send`` calls in a row (same
        partitions, same order, the same retries and sequence numbers), for a fraction
        of the cost per record. ``keys``, when given, pairs with ``values``; ``headers``
        and ``timestamp_ms`` apply to every record. The list is checked as a whole
        first: a refused one queues nothing.

        Returns a sequence of the records' futures (``RecordFutures``), each made when
        first asked for; ``results()`` waits for them all."""
        values = values if isinstance(values, list | tuple) else list(values)
        if self._core.buffer_full():
            self._wait_for_room()
        futures = RecordFutures(len(values))
        while True:
            with self._cond:
                queued = self._core.append_many(
                    topic, values, keys, partition, headers, timestamp_ms, futures
                )
                if queued:
                    self._cond.notify()
                    return futures
            self._drive(calls.fetch_topic(self._core, topic))

    def flush(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Send every queued record now and wait until all are acknowledged or failed."""
        with self._cond:
            pending = self._core.begin_flush()
            self._cond.notify()
        try:
            self._wait(pending, resolve_timeout(timeout, self._config.delivery_timeout_ms))
        finally:
            with self._cond:
                self._core.end_flush()

    def close(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush what is queued (best effort within ``timeout``), then stop."""
        if self._core.closed:
            return
        with contextlib.suppress(Exception):
            self.flush(timeout)
        with self._cond:
            self._core.closed = True
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True)
        self._io.shutdown(wait=False, cancel_futures=True)  # a given-up attempt may linger
        self._http.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the sender ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                actions = self._core.next_actions()
                if actions.empty:
                    wait_s = None
                    if actions.wake_at_ms is not None:
                        wait_s = max(0.0, (actions.wake_at_ms - now_ms()) / 1000)
                    self._cond.wait(wait_s)
                    continue
            self._dispatch(actions)

    def _dispatch(self, actions: Actions) -> None:
        if actions.init_producer_id:
            self._pool.submit(self._background, calls.init_producer_id(self._core))
        if actions.add_partitions:
            steps = calls.add_partitions(self._core, actions.add_partitions)
            self._add_future = self._pool.submit(self._background, steps)
        for url, batches in actions.requests:
            steps = (
                calls.produce(self._core, batches[0])
                if url is None
                else calls.produce_many(self._core, url, batches)
            )
            self._pool.submit(self._background, steps)

    def _background(self, steps: Steps[None]) -> None:
        """A request of the sender's, on a worker; then the sender looks at the queues,
        and the futures of acknowledged batches are settled, outside the lock."""
        self._drive(steps)
        with self._cond:
            settlements = self._core.take_settlements()
            self._cond.notify()
            self._room.notify_all()
        for settle in settlements:
            settle()

    def _wait_for_room(self) -> None:
        """Wait while the buffered records fill ``buffer_memory`` (Kafka's blocking
        ``send``), at most ``max_block_ms``. Woken when an answer frees room; looked at
        again every 100 ms as well, for room freed by expiry or an abort."""
        limit_s = self._config.max_block_ms / 1000
        deadline = time.monotonic() + limit_s
        with self._cond:
            while self._core.buffer_full() and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._core.buffer_timeout()
                self._cond.notify()  # the sender drains what is queued
                self._room.wait(min(remaining, 0.1))

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _on_wire(self, batches: tuple[ProducerBatch, ...]) -> None:
        with self._cond:
            for batch in batches:
                self._core.on_wire(batch)
            self._cond.notify()

    # --- the driver of the core's sequences ----------------------------------------------

    def _drive(self, steps: Steps[T]) -> T:
        """Run one of the core's sequences (``sdk._txn_calls``): its decisions under the
        lock, each step's I/O outside it; the step's answer or error goes back in."""
        answer: Any = None
        error: Exception | None = None
        while True:
            with self._cond:
                try:
                    step = steps.send(answer) if error is None else steps.throw(error)
                except StopIteration as done:
                    result: T = done.value
                    return result
            try:
                answer, error = self._perform(step), None
            except Exception as exc:
                answer, error = None, exc

    def _perform(self, step: Step) -> Any:
        match step:
            case Call():
                return self._http.call(
                    step.req,
                    step.method,
                    step.path,
                    base=self._base(step.locate),
                    json=self._locked(step.body),
                    params=step.params,
                    timeout_s=step.timeout_s,
                    invalidate=step.invalidate,
                )
            case Produce():
                batches = step.batches
                send = self._io.submit(
                    self._http.send_once, "POST", step.url, json=step.body,
                    on_wire=lambda: self._on_wire(batches),
                )  # fmt: skip
                return self._answer_or_moved(send, step)
            case Flush():
                return self.flush(step.timeout_s)
            case AwaitInFlight():
                with self._cond:
                    add = self._add_future
                if add is not None:
                    wait_futures([add], timeout=step.timeout_s)
                return self._wait(step.pending, step.timeout_s)

    def _answer_or_moved(self, send: Future[Any], step: Produce) -> Any:
        """The produce attempt's answer; while none comes, the leaders of its partitions
        are looked up every ``LEADER_CHECK_S``, and once one is led elsewhere the attempt
        is given up (``LeaderMovedError``: sent again to the new leader). The request
        itself runs on an I/O thread, which a given-up attempt keeps until its own
        timeout; its answer then goes nowhere."""
        while True:
            try:
                return send.result(timeout=LEADER_CHECK_S)
            except FutureTimeoutError:
                pass
            try:
                self._drive(calls.refresh_leaders(self._core, step.batches))
            except Exception:
                continue  # no coordinator answers now: keep waiting for the node
            with self._cond:
                moved = self._core.led_elsewhere(step.url, step.batches)
            if moved:
                raise LeaderMovedError(f"{step.url}: the leader moved while unanswered")

    def _base(self, locate: Callable[[], Steps[str]] | None) -> Callable[[], str]:
        if locate is None:
            return self._bootstrap
        return lambda: self._drive(locate())

    def _locked(self, body: Body | None) -> Body | None:
        """A body built anew for each attempt is built under the lock."""
        if not callable(body):
            return body
        build = body

        def each_attempt() -> dict[str, Any]:
            with self._cond:
                return build()

        return each_attempt

    def _bootstrap(self) -> str:
        return self._http.bootstrap(self._core.metadata)

    def _wait(self, futures: list[FutureLike[None]], timeout_s: float | None) -> None:
        pending = [f for f in futures if isinstance(f, Future)]
        _, not_done = wait_futures(pending, timeout=timeout_s)
        if not_done:
            raise EosTimeoutError(f"{len(not_done)} batches not acknowledged within {timeout_s}s")


class Producer(_SyncProducerBase):
    """An idempotent producer: retries never duplicate or reorder records, no transactions.

    Example::

        with Producer("http://127.0.0.1:8080") as producer:
            future = producer.send("orders", "order-1", key="customer-7")
            print(future.result().offset)
    """

    def __init__(
        self,
        bootstrap_url: Bootstrap,
        *,
        linger_ms: int = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
        max_block_ms: int = 60_000,
        buffer_memory: int = 33_554_432,
        retry: RetryConfig | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        config = ProducerConfig(
            bootstrap_url,
            linger_ms=linger_ms,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            delivery_timeout_ms=delivery_timeout_ms,
            max_block_ms=max_block_ms,
            buffer_memory=buffer_memory,
            retry=retry or RetryConfig(),
            headers=headers or {},
            token=token,
            ca_file=ca_file,
        )
        super().__init__(config, transport)

    def __enter__(self) -> Producer:
        return self


class TransactionalProducer(_SyncProducerBase):
    """Kafka's transactional producer: records and consumer offsets commit atomically.

    Example::

        producer = TransactionalProducer("http://127.0.0.1:8080", "orders-enricher-0")
        producer.init_transactions()
        with producer.transaction():
            producer.send("enriched", "order-1+", key="customer-7")
            producer.send_offsets_to_transaction({("orders", 0): 42}, "enricher")
        producer.close()
    """

    def __init__(
        self,
        bootstrap_url: Bootstrap,
        transactional_id: str,
        *,
        transaction_timeout_ms: int = 60_000,
        transaction_version: int | None = None,
        linger_ms: int = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
        max_block_ms: int = 60_000,
        buffer_memory: int = 33_554_432,
        retry: RetryConfig | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        config = ProducerConfig(
            bootstrap_url,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            transaction_version=transaction_version,
            linger_ms=linger_ms,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            delivery_timeout_ms=delivery_timeout_ms,
            max_block_ms=max_block_ms,
            buffer_memory=buffer_memory,
            retry=retry or RetryConfig(),
            headers=headers or {},
            token=token,
            ca_file=ca_file,
        )
        super().__init__(config, transport)

    def __enter__(self) -> TransactionalProducer:
        return self

    @property
    def transactional_id(self) -> str:
        tid = self._core.txn.transactional_id
        assert tid is not None
        return tid

    def init_transactions(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Get the producer id and epoch, fencing any older producer with this id and
        aborting its open transaction."""
        self._drive(calls.init_transactions(self._core, timeout))

    def begin_transaction(self) -> None:
        with self._cond:
            self._core.txn.begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Offsets,
        group_id_or_metadata: str | ConsumerGroupMetadata,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> None:
        """Commit the consumer group's offsets with this transaction (the offsets are the
        next records to read). AddOffsetsToTxn at the coordinator, then TxnOffsetCommit
        at the group's storage node.

        Pass the consumer's ``group_metadata()`` rather than its group id when it is
        subscribed (KIP-447): the offsets, and the commit, are then refused with
        ``FencedMemberEpochError`` or ``UnknownMemberIdError`` once that member lost the
        partitions (the producer is then in ABORTABLE_ERROR: abort the transaction)."""
        self._drive(calls.send_offsets_to_transaction(
            self._core, offsets, group_id_or_metadata, timeout))

    def commit_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush, wait for every acknowledgement, then commit at the coordinator. On an
        abortable error the producer is in ABORTABLE_ERROR: call ``abort_transaction``."""
        self._drive(calls.commit_transaction(self._core, timeout))

    def abort_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Drop unsent records, wait for those in flight, abort at the coordinator; bump
        the epoch afterwards if a sequence number was left in doubt (KIP-360)."""
        self._drive(calls.abort_transaction(self._core, timeout))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """``begin_transaction``; commit when the block ends, abort if it raises (or if the
        commit fails with an abortable error). A fatal error is raised as it is."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self._core.state is not ProducerState.FATAL_ERROR:
                with contextlib.suppress(Exception):
                    self.abort_transaction()
            raise
        try:
            self.commit_transaction()
        except FatalError:
            raise
        except Exception:
            if self._core.state is ProducerState.ABORTABLE_ERROR:
                self.abort_transaction()
            raise
