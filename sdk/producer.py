"""Blocking producers: ``TransactionalProducer`` and the idempotent ``Producer``.

Kafka's design: ``send`` only queues the record and returns a future; a sender thread
drains the batches (the decisions are ``ProducerCore``'s) and hands each request to a small
pool of worker threads, so up to ``max_in_flight`` batches per partition travel at once.
The async twin in ``sdk.aio.producer`` makes the same calls with tasks instead of threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
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
from sdk._transport import Req, SyncTransport
from sdk._types import Offsets, Payload, RecordMetadata, TopicPartition

_WORKERS = 32


class _SyncProducerBase:
    """The sender thread and the calls both producers share."""

    def __init__(self, config: ProducerConfig, transport: httpx.BaseTransport | None) -> None:
        self._config = config
        self._core = ProducerCore(config, batch_future=Future)
        self._http = SyncTransport(config.retry, transport=transport, headers=config.headers,
            token=config.token, ca_file=config.ca_file,
        )
        self._http.on_unreachable = self._core.metadata.unreachable
        self._cond = threading.Condition(threading.RLock())
        self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="eos-producer")
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
        with self._cond:
            self._core.check_send()
        if self._core.metadata.partition_count(topic) is None:
            self._fetch_topic(topic)
        future: Future[RecordMetadata] = Future()
        with self._cond:
            self._core.check_send()
            tp = self._core.choose_partition(topic, key, partition)
            keyless = key is None and partition is None
            if self._core.append(tp, key, value, headers, timestamp_ms, future, keyless):
                self._cond.notify()
        return future

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
            self._pool.submit(self._init_producer_id)
        if actions.add_partitions:
            self._add_future = self._pool.submit(self._add_partitions, actions.add_partitions)
        for batch in actions.batches:
            self._pool.submit(self._produce, batch)

    def _init_producer_id(self) -> None:
        try:
            body = self._http.call(
                Req.INIT_PRODUCER_ID,
                "POST",
                "/v1/producers",
                base=self._bootstrap,
                json={},
                timeout_s=self._config.max_block_ms / 1000,
            )
        except Exception as exc:
            with self._cond:
                self._core.on_producer_id_failed(exc)
                self._cond.notify()
            return
        with self._cond:
            self._core.on_producer_id(body)
            self._cond.notify()

    def _add_partitions(self, tps: list[TopicPartition]) -> None:
        def body() -> dict[str, Any]:
            with self._cond:
                return self._core.add_partitions_body(tps)

        try:
            answer = self._txn_call(Req.ADD_PARTITIONS, "partitions", body, USE_DEFAULT)
        except Exception as exc:
            with self._cond:
                self._core.on_add_failed(tps, exc)
                self._cond.notify()
            return
        with self._cond:
            self._core.on_add_result(tps, answer)
            self._cond.notify()

    def _produce(self, batch: ProducerBatch) -> None:
        try:
            url = self._core.metadata.leader(batch.tp)
            if url is None:
                url = self._fetch_topic(batch.tp.topic)[batch.tp.partition]
            body = self._http.send_once(
                "POST",
                url + records_path(batch.tp),
                json=batch.request_body(self._core.transactional),
                on_wire=lambda: self._on_wire(batch),
            )
        except Exception as exc:
            with self._cond:
                self._core.on_produce_error(batch, exc)
                self._cond.notify()
            return
        with self._cond:
            self._core.on_produce_ok(batch, body)
            self._cond.notify()

    def _on_wire(self, batch: ProducerBatch) -> None:
        with self._cond:
            self._core.on_wire(batch)
            self._cond.notify()

    # --- helpers -------------------------------------------------------------------------

    def _bootstrap(self) -> str:
        return self._http.bootstrap(self._core.metadata)

    def _fetch_topic(self, topic: str) -> list[str]:
        body = self._http.call(
            Req.TOPIC,
            "GET",
            topic_path(topic),
            base=self._bootstrap,
            timeout_s=self._config.max_block_ms / 1000,
        )
        return self._core.metadata.update_topic(body)

    def _coordinator(self) -> str:
        url = self._core.metadata.txn_coordinator
        if url is None:
            tid = self._core.txn.transactional_id
            assert tid is not None
            body = self._http.call(
                Req.FIND_COORDINATOR,
                "GET",
                "/v1/coordinators",
                base=self._bootstrap,
                params=find_coordinator_params(tid, "transaction"),
                timeout_s=self._config.max_block_ms / 1000,
            )
            url = self._core.metadata.txn_coordinator = str(body["url"]).rstrip("/")
        return url

    def _txn_call(self, req: Req, action: str, body: Body, timeout: TimeoutArg) -> Any:
        tid = self._core.txn.transactional_id
        assert tid is not None
        return self._http.call(
            req,
            "POST",
            txn_path(tid, action),
            base=self._coordinator,
            json=body,
            timeout_s=resolve_timeout(timeout, self._config.max_block_ms),
            invalidate=self._core.metadata.invalidate_txn_coordinator,
        )

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
        batch_size: int = 16_384,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
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
        linger_ms: int = 5,
        batch_size: int = 16_384,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
        max_block_ms: int = 60_000,
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
        with self._cond:
            self._core.txn.begin_init()
        try:
            body = self._txn_call(
                Req.INIT_TRANSACTIONS, "init", self._core.init_body(False), timeout
            )
        except Exception as exc:
            with self._cond:
                self._core.txn.on_error(exc)
            raise
        with self._cond:
            self._core.on_init(body)

    def begin_transaction(self) -> None:
        with self._cond:
            self._core.txn.begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Offsets,
        group_id: str,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> None:
        """Commit the consumer group's offsets with this transaction (the offsets are the
        next records to read). AddOffsetsToTxn at the coordinator, then TxnOffsetCommit
        at the group's storage node."""
        wanted = normalise_offsets(offsets)
        with self._cond:
            self._core.txn.ensure_can_add_offsets()
        try:
            self._txn_call(
                Req.ADD_OFFSETS, "offsets", {**self._core.end_body(), "group_id": group_id}, timeout
            )
            with self._cond:
                self._core.txn.on_offsets_added(group_id)
            self._http.call(
                Req.TXN_OFFSET_COMMIT,
                "POST",
                group_path(group_id, "txn-offsets"),
                base=lambda: self._group_node(group_id),
                json=self._core.txn_offsets_body(wanted),
                timeout_s=resolve_timeout(timeout, self._config.max_block_ms),
                invalidate=lambda _exc: self._core.metadata.invalidate_group(group_id),
            )
        except Exception as exc:
            with self._cond:
                self._core.on_request_error(exc)
            raise

    def _group_node(self, group_id: str) -> str:
        url = self._core.metadata.group_node(group_id)
        if url is None:
            body = self._http.call(
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

    def commit_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Flush, wait for every acknowledgement, then commit at the coordinator. On an
        abortable error the producer is in ABORTABLE_ERROR: call ``abort_transaction``."""
        with self._cond:
            self._core.txn.begin_commit()
        self.flush(resolve_timeout(timeout, self._config.max_block_ms))
        with self._cond:
            self._core.commit_outcome()
        if self._core.txn.needs_end_call:
            try:
                self._txn_call(Req.END_TXN, "commit", self._core.end_body(), timeout)
            except EosTimeoutError:
                raise  # still COMMITTING: calling commit_transaction again retries it
            except Exception as exc:
                with self._cond:
                    self._core.on_request_error(exc)
                raise
        with self._cond:
            self._core.txn.complete_end()

    def abort_transaction(self, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Drop unsent records, wait for those in flight, abort at the coordinator; bump
        the epoch afterwards if a sequence number was left in doubt (KIP-360)."""
        with self._cond:
            self._core.begin_abort()
            pending = self._core.accumulator.pending_done()
            add = self._add_future
        timeout_s = resolve_timeout(timeout, self._config.max_block_ms)
        if add is not None:
            wait_futures([add], timeout=timeout_s)
        self._wait(pending, timeout_s)
        if self._core.txn.needs_end_call:
            try:
                self._txn_call(Req.END_TXN, "abort", self._core.end_body(), timeout)
            except InvalidTxnStateError:
                if self._core.txn.partitions or self._core.txn.groups:
                    with self._cond:
                        self._core.txn.to_fatal(InvalidTxnStateError("abort refused"))
                    raise
                # nothing was confirmed added: there was no transaction to abort
            except EosTimeoutError:
                raise
            except Exception as exc:
                with self._cond:
                    self._core.on_request_error(exc)
                raise
        with self._cond:
            self._core.txn.complete_end()
        if self._core.state is ProducerState.INITIALIZING:
            body = self._txn_call(
                Req.INIT_TRANSACTIONS, "init", self._core.init_body(True), timeout
            )
            with self._cond:
                self._core.on_init(body)

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
