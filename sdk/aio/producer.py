"""Async producers: ``AsyncTransactionalProducer`` and ``AsyncProducer``.

The twin of ``sdk.producer``: the same ``ProducerCore`` decides, a sender task drains the
batches and each request is a task of its own, so up to ``max_in_flight`` batches per
partition travel at once. ``send`` is awaited (it may have to fetch the topic's metadata)
and returns an ``asyncio.Future`` of the record's ``RecordMetadata``.
"""

# The twins share their signatures, ``timeout=`` included (ruff's ASYNC109 would have the
# async one take ``asyncio.timeout`` instead).
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import httpx

from eos_protocol.errors import FatalError, InvalidTxnStateError
from sdk._accumulator import FutureLike, ProducerBatch
from sdk._config import USE_DEFAULT, ProducerConfig, RetryConfig, TimeoutArg, resolve_timeout
from sdk._errors import EosTimeoutError
from sdk._metadata import (
    Bootstrap,
    find_coordinator_params,
    group_path,
    records_path,
    topic_path,
    txn_path,
)
from sdk._producer_base import Actions, Body, ProducerCore, normalise_offsets, now_ms
from sdk._state import ProducerState
from sdk._transport import AsyncTransport, Req
from sdk._types import Offsets, Payload, RecordMetadata, TopicPartition


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
        self._core.check_send()
        if self._core.metadata.partition_count(topic) is None:
            await self._fetch_topic(topic)
        self._core.check_send()
        self._ensure_sender()
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        tp = self._core.choose_partition(topic, key, partition)
        keyless = key is None and partition is None
        if self._core.append(tp, key, value, headers, timestamp_ms, future, keyless):
            self._notify()
            # Yield once per batch: a loop of sends that never waits would otherwise keep
            # the sender task (and so every request) from running until it ends.
            await asyncio.sleep(0)
        return future

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
            self._spawn(self._init_producer_id())
        if actions.add_partitions:
            self._add_task = self._spawn(self._add_partitions(actions.add_partitions))
        for batch in actions.batches:
            self._spawn(self._produce(batch))

    async def _init_producer_id(self) -> None:
        try:
            body = await self._http.call(
                Req.INIT_PRODUCER_ID,
                "POST",
                "/v1/producers",
                base=self._bootstrap,
                json={},
                timeout_s=self._config.max_block_ms / 1000,
            )
        except Exception as exc:
            self._core.on_producer_id_failed(exc)
        else:
            self._core.on_producer_id(body)
        self._notify()

    async def _add_partitions(self, tps: list[TopicPartition]) -> None:
        def body() -> dict[str, Any]:
            return self._core.add_partitions_body(tps)

        try:
            answer = await self._txn_call(Req.ADD_PARTITIONS, "partitions", body, USE_DEFAULT)
        except Exception as exc:
            self._core.on_add_failed(tps, exc)
        else:
            self._core.on_add_result(tps, answer)
        self._notify()

    async def _produce(self, batch: ProducerBatch) -> None:
        def on_wire() -> None:
            self._core.on_wire(batch)
            self._notify()

        try:
            url = self._core.metadata.leader(batch.tp)
            if url is None:
                url = (await self._fetch_topic(batch.tp.topic))[batch.tp.partition]
            body = await self._http.send_once(
                "POST",
                url + records_path(batch.tp),
                json=batch.request_body(self._core.transactional),
                on_wire=on_wire,
            )
        except Exception as exc:
            self._core.on_produce_error(batch, exc)
        else:
            self._core.on_produce_ok(batch, body)
        self._notify()

    # --- helpers -------------------------------------------------------------------------

    async def _bootstrap(self) -> str:
        return await self._http.bootstrap(self._core.metadata)

    async def _fetch_topic(self, topic: str) -> list[str]:
        body = await self._http.call(
            Req.TOPIC,
            "GET",
            topic_path(topic),
            base=self._bootstrap,
            timeout_s=self._config.max_block_ms / 1000,
        )
        return self._core.metadata.update_topic(body)

    async def _coordinator(self) -> str:
        url = self._core.metadata.txn_coordinator
        if url is None:
            tid = self._core.txn.transactional_id
            assert tid is not None
            body = await self._http.call(
                Req.FIND_COORDINATOR,
                "GET",
                "/v1/coordinators",
                base=self._bootstrap,
                params=find_coordinator_params(tid, "transaction"),
                timeout_s=self._config.max_block_ms / 1000,
            )
            url = self._core.metadata.txn_coordinator = str(body["url"]).rstrip("/")
        return url

    async def _txn_call(self, req: Req, action: str, body: Body, timeout: TimeoutArg) -> Any:
        tid = self._core.txn.transactional_id
        assert tid is not None
        return await self._http.call(
            req,
            "POST",
            txn_path(tid, action),
            base=self._coordinator,
            json=body,
            timeout_s=resolve_timeout(timeout, self._config.max_block_ms),
            invalidate=self._core.metadata.invalidate_txn_coordinator,
        )

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
        batch_size: int = 16_384,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
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
        linger_ms: int = 5,
        batch_size: int = 16_384,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
        max_block_ms: int = 60_000,
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
            linger_ms=linger_ms,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            delivery_timeout_ms=delivery_timeout_ms,
            max_block_ms=max_block_ms,
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
        self._core.txn.begin_init()
        try:
            body = await self._txn_call(
                Req.INIT_TRANSACTIONS, "init", self._core.init_body(False), timeout
            )
        except Exception as exc:
            self._core.txn.on_error(exc)
            raise
        self._core.on_init(body)

    def begin_transaction(self) -> None:
        self._core.txn.begin_transaction()

    async def send_offsets_to_transaction(
        self,
        offsets: Offsets,
        group_id: str,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> None:
        """Commit the group's offsets with this transaction (AddOffsetsToTxn at the
        coordinator, then TxnOffsetCommit at the group's storage node)."""
        wanted = normalise_offsets(offsets)
        self._core.txn.ensure_can_add_offsets()
        try:
            await self._txn_call(
                Req.ADD_OFFSETS, "offsets", {**self._core.end_body(), "group_id": group_id}, timeout
            )
            self._core.txn.on_offsets_added(group_id)

            async def node() -> str:
                return await self._group_node(group_id)

            await self._http.call(
                Req.TXN_OFFSET_COMMIT,
                "POST",
                group_path(group_id, "txn-offsets"),
                base=node,
                json=self._core.txn_offsets_body(wanted),
                timeout_s=resolve_timeout(timeout, self._config.max_block_ms),
                invalidate=lambda _exc: self._core.metadata.invalidate_group(group_id),
            )
        except Exception as exc:
            self._core.on_request_error(exc)
            raise

    async def _group_node(self, group_id: str) -> str:
        url = self._core.metadata.group_node(group_id)
        if url is None:
            body = await self._http.call(
                Req.FIND_COORDINATOR,
                "GET",
                "/v1/coordinators",
                base=self._bootstrap,
                params=find_coordinator_params(group_id, "group"),
                timeout_s=self._config.max_block_ms / 1000,
            )
            self._core.metadata.set_group_node(group_id, str(body["url"]))
            url = self._core.metadata.group_node(group_id)
            assert url is not None
        return url

    async def commit_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush, wait for every acknowledgement, then commit at the coordinator."""
        self._core.txn.begin_commit()
        await self.flush(resolve_timeout(timeout, self._config.max_block_ms))
        self._core.commit_outcome()
        if self._core.txn.needs_end_call:
            try:
                await self._txn_call(Req.END_TXN, "commit", self._core.end_body(), timeout)
            except EosTimeoutError:
                raise  # still COMMITTING: calling commit_transaction again retries it
            except Exception as exc:
                self._core.on_request_error(exc)
                raise
        self._core.txn.complete_end()

    async def abort_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Drop unsent records, wait for those in flight, abort at the coordinator; bump
        the epoch afterwards if a sequence number was left in doubt (KIP-360)."""
        self._core.begin_abort()
        pending = self._core.accumulator.pending_done()
        timeout_s = resolve_timeout(timeout, self._config.max_block_ms)
        if self._add_task is not None and not self._add_task.done():
            await asyncio.wait([self._add_task], timeout=timeout_s)
        await self._wait(pending, timeout_s)
        if self._core.txn.needs_end_call:
            try:
                await self._txn_call(Req.END_TXN, "abort", self._core.end_body(), timeout)
            except InvalidTxnStateError:
                if self._core.txn.partitions or self._core.txn.groups:
                    self._core.txn.to_fatal(InvalidTxnStateError("abort refused"))
                    raise
                # nothing was confirmed added: there was no transaction to abort
            except EosTimeoutError:
                raise
            except Exception as exc:
                self._core.on_request_error(exc)
                raise
        self._core.txn.complete_end()
        if self._core.state is ProducerState.INITIALIZING:
            body = await self._txn_call(
                Req.INIT_TRANSACTIONS, "init", self._core.init_body(True), timeout
            )
            self._core.on_init(body)

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
