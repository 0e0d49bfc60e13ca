"""Async producers: ``AsyncTransactionalProducer`` and ``AsyncProducer``.

The twin of ``sdk.producer``: the same ``ProducerCore`` decides, a sender task drains the
batches and each request is a task of its own, so up to ``max_in_flight`` batches per
partition travel at once. The calls are the same sequences of ``sdk._txn_calls``, driven
here by an awaiting ``_drive``. ``send`` is awaited (it may have to fetch the topic's
metadata) and returns an ``asyncio.Future`` of the record's ``RecordMetadata``.
"""

# The twins share their signatures, ``timeout=`` included (ruff's ASYNC109 would have the
# async one take ``asyncio.timeout`` instead).
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import httpx

from eos_protocol.errors import FatalError
from sdk import _txn_calls as calls
from sdk._accumulator import FutureLike
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
    LeaderMovedError,
    ProducerCore,
    now_ms,
)
from sdk._record_futures import AsyncRecordFutures
from sdk._state import ProducerState
from sdk._transport import AsyncTransport
from sdk._txn_calls import AwaitInFlight, Call, Flush, Produce, Step, Steps
from sdk._types import ConsumerGroupMetadata, Offsets, Payload, RecordMetadata

T = TypeVar("T")


def _loop_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


class _AsyncProducerBase:
    """The sender task and the calls both async producers share."""

    def __init__(self, config: ProducerConfig, transport: httpx.AsyncBaseTransport | None) -> None:
        self._config = config
        self._core = ProducerCore(config, batch_future=_loop_future)
        self._http = AsyncTransport(config.retry, transport=transport, headers=config.headers,
            token=config.token, ca_file=config.ca_file,
        )
        self._http.on_unreachable = self._core.metadata.unreachable
        self._wake: asyncio.Event | None = None
        self._room: asyncio.Event | None = None  # set when an answer frees buffer room
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._add_task: asyncio.Task[None] | None = None
        self._stopping = False

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

    async def send(
        self,
        topic: str,
        value: Payload | None,
        key: Payload | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; the returned future resolves to its ``RecordMetadata``."""
        if self._core.buffer_full():
            await self._wait_for_room()
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        wake = self._core.try_append(topic, value, key, partition, headers, timestamp_ms, future)
        if wake is None:  # the topic is not known yet: look it up, then queue
            steps = calls.send(
                self._core, topic, value, key, partition, headers, timestamp_ms, future
            )
            wake = await self._drive(steps)
        self._ensure_sender()
        if wake:
            self._notify()
            # Yield once per batch: a loop of sends that never waits would otherwise keep
            # the sender task (and so every request) from running until it ends.
            await asyncio.sleep(0)
        return future

    async def send_many(
        self,
        topic: str,
        values: Sequence[Payload | None],
        keys: Sequence[Payload | None] | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp_ms: int | None = None,
    ) -> AsyncRecordFutures:
        """Queue a list of records in one call: as many ``send`` calls in a row (same
        partitions, same order), for a fraction of the cost per record. ``keys``, when
        given, pairs with ``values``; ``headers`` and ``timestamp_ms`` apply to every
        record. A refused list queues nothing. Returns the records' futures, each made
        when first asked for; ``await futures.results()`` waits for them all."""
        values = values if isinstance(values, list | tuple) else list(values)
        if self._core.buffer_full():
            await self._wait_for_room()
        futures = AsyncRecordFutures(len(values))
        while not self._core.append_many(
            topic, values, keys, partition, headers, timestamp_ms, futures
        ):
            await self._drive(calls.fetch_topic(self._core, topic))
        self._ensure_sender()
        self._notify()
        await asyncio.sleep(0)  # let the sender run, as send does once per batch
        return futures

    async def send_and_wait(
        self,
        topic: str,
        value: Payload | None,
        key: Payload | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> RecordMetadata:
        """``send`` and wait for the acknowledgement."""
        return await (await self.send(topic, value, key, partition, headers))

    async def flush(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Send every queued record now and wait until all are acknowledged or failed."""
        pending = self._core.begin_flush()
        self._notify()
        try:
            await self._wait(pending, resolve_timeout(timeout, self._config.delivery_timeout_ms))
        finally:
            self._core.end_flush()

    async def close(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush what is queued (best effort within ``timeout``), then stop."""
        if self._core.closed:
            return
        with contextlib.suppress(Exception):
            await self.flush(timeout)
        self._core.closed = True
        self._stopping = True
        self._notify()
        if self._sender is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        await self._http.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- the sender ----------------------------------------------------------------------

    def _ensure_sender(self) -> None:
        if self._sender is None:
            self._wake = asyncio.Event()
            self._sender = asyncio.create_task(self._run(), name="eos-sender")

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            actions = self._core.next_actions()
            if actions.empty:
                timeout = None
                if actions.wake_at_ms is not None:
                    timeout = max(0.0, (actions.wake_at_ms - now_ms()) / 1000)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            self._dispatch(actions)
            await asyncio.sleep(0)  # let the requests start before draining again

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _dispatch(self, actions: Actions) -> None:
        if actions.init_producer_id:
            self._spawn(self._background(calls.init_producer_id(self._core)))
        if actions.add_partitions:
            steps = calls.add_partitions(self._core, actions.add_partitions)
            self._add_task = self._spawn(self._background(steps))
        for url, batches in actions.requests:
            steps = (
                calls.produce(self._core, batches[0])
                if url is None
                else calls.produce_many(self._core, url, batches)
            )
            self._spawn(self._background(steps))

    async def _background(self, steps: Steps[None]) -> None:
        """A request of the sender's, as a task; then the sender looks at the queues."""
        await self._drive(steps)
        self._notify()
        if self._room is not None and not self._core.buffer_full():
            self._room.set()

    async def _wait_for_room(self) -> None:
        """Wait while the buffered records fill ``buffer_memory`` (Kafka's blocking
        ``send``), at most ``max_block_ms``. Woken when an answer frees room; looked at
        again every 100 ms as well, for room freed by expiry or an abort."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.max_block_ms / 1000
        self._ensure_sender()
        while self._core.buffer_full() and not self._stopping:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._core.buffer_timeout()
            if self._room is None or self._room.is_set():
                self._room = asyncio.Event()
            self._notify()  # the sender drains what is queued
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), min(remaining, 0.1))

    # --- the driver of the core's sequences ----------------------------------------------

    async def _drive(self, steps: Steps[T]) -> T:
        """Run one of the core's sequences (``sdk._txn_calls``): it decides, this awaits
        each step's I/O and hands the step's answer or error back in."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                step = steps.send(answer) if error is None else steps.throw(error)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                answer, error = await self._perform(step), None
            except Exception as exc:
                answer, error = None, exc

    async def _perform(self, step: Step) -> Any:
        match step:
            case Call():
                return await self._http.call(
                    step.req,
                    step.method,
                    step.path,
                    base=self._base(step.locate),
                    json=step.body,
                    params=step.params,
                    timeout_s=step.timeout_s,
                    invalidate=step.invalidate,
                )
            case Produce():
                batches = step.batches

                def on_wire() -> None:
                    for batch in batches:
                        self._core.on_wire(batch)
                    self._notify()

                send = asyncio.ensure_future(
                    self._http.send_once("POST", step.url, json=step.body, on_wire=on_wire)
                )
                return await self._answer_or_moved(send, step)
            case Flush():
                return await self.flush(step.timeout_s)
            case AwaitInFlight():
                if self._add_task is not None and not self._add_task.done():
                    await asyncio.wait([self._add_task], timeout=step.timeout_s)
                return await self._wait(step.pending, step.timeout_s)

    async def _answer_or_moved(self, send: asyncio.Future[Any], step: Produce) -> Any:
        """The produce attempt's answer; while none comes, the leaders of its partitions
        are looked up every ``LEADER_CHECK_S``, and once one is led elsewhere the attempt
        is given up (``LeaderMovedError``: sent again to the new leader)."""
        try:
            while True:
                done, _ = await asyncio.wait({send}, timeout=LEADER_CHECK_S)
                if done:
                    return send.result()
                try:
                    await self._drive(calls.refresh_leaders(self._core, step.batches))
                except Exception:
                    continue  # no coordinator answers now: keep waiting for the node
                if self._core.led_elsewhere(step.url, step.batches):
                    raise LeaderMovedError(f"{step.url}: the leader moved while unanswered")
        finally:
            if not send.done():
                send.cancel()

    def _base(self, locate: Callable[[], Steps[str]] | None) -> Callable[[], Awaitable[str]]:
        if locate is None:
            return self._bootstrap
        return lambda: self._drive(locate())

    async def _bootstrap(self) -> str:
        return await self._http.bootstrap(self._core.metadata)

    async def _wait(self, futures: list[FutureLike[None]], timeout_s: float | None) -> None:
        pending = [f for f in futures if isinstance(f, asyncio.Future) and not f.done()]
        if not pending:
            return
        _, not_done = await asyncio.wait(pending, timeout=timeout_s)
        if not_done:
            raise EosTimeoutError(f"{len(not_done)} batches not acknowledged within {timeout_s}s")


class AsyncProducer(_AsyncProducerBase):
    """The async idempotent producer (twin of ``Producer``).

    Example::

        async with AsyncProducer("http://127.0.0.1:8080") as producer:
            meta = await producer.send_and_wait("orders", "order-1", key="customer-7")
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
        transport: httpx.AsyncBaseTransport | None = None,
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

    async def __aenter__(self) -> AsyncProducer:
        return self


class AsyncTransactionalProducer(_AsyncProducerBase):
    """The async transactional producer (twin of ``TransactionalProducer``).

    Example::

        producer = AsyncTransactionalProducer("http://127.0.0.1:8080", "enricher-0")
        await producer.init_transactions()
        async with producer.transaction():
            await producer.send("enriched", "order-1+")
            await producer.send_offsets_to_transaction({("orders", 0): 42}, "enricher")
        await producer.close()
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
        transport: httpx.AsyncBaseTransport | None = None,
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

    async def __aenter__(self) -> AsyncTransactionalProducer:
        return self

    @property
    def transactional_id(self) -> str:
        tid = self._core.txn.transactional_id
        assert tid is not None
        return tid

    async def init_transactions(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Get the producer id and epoch, fencing any older producer with this id."""
        await self._drive(calls.init_transactions(self._core, timeout))

    def begin_transaction(self) -> None:
        self._core.txn.begin_transaction()

    async def send_offsets_to_transaction(
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
        await self._drive(calls.send_offsets_to_transaction(
            self._core, offsets, group_id_or_metadata, timeout))

    async def commit_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush, wait for every acknowledgement, then commit at the coordinator."""
        await self._drive(calls.commit_transaction(self._core, timeout))

    async def abort_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Drop unsent records, wait for those in flight, abort at the coordinator; bump
        the epoch afterwards if a sequence number was left in doubt (KIP-360)."""
        await self._drive(calls.abort_transaction(self._core, timeout))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransactionalProducer]:
        """``begin_transaction``; commit when the block ends, abort if it raises (or if the
        commit fails with an abortable error). A fatal error is raised as it is."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self._core.state is not ProducerState.FATAL_ERROR:
                with contextlib.suppress(Exception):
                    await self.abort_transaction()
            raise
        try:
            await self.commit_transaction()
        except FatalError:
            raise
        except Exception:
            if self._core.state is ProducerState.ABORTABLE_ERROR:
                await self.abort_transaction()
            raise
