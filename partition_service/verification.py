"""KIP-890 verification: a transactional batch may only open a transaction on a partition
that the coordinator has added to that producer's transaction.

Without it, a late batch of a producer whose transaction has already ended would open a
new, never-ending transaction here and hold back the LSO forever. The node asks the
coordinator (any instance answers from the shared store; add-partitions is durable before
it is acknowledged), and only when the batch would open a transaction: later batches of the
same transaction, at the same epoch, need no second question.

The question is one small GET per transaction and partition, so its cost shows in every
transactional produce. httpx's connection pool checks every idle connection of the pool
for staleness on each request, which with a few dozen concurrent producers cost the node
more CPU than the append itself; a plain ``http://`` coordinator is therefore asked over
``KeepAliveClient``, a minimal HTTP/1.1 client with a LIFO pool of keep-alive connections.
An ``https://`` coordinator, or an ``httpx`` client handed in, still goes through httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from sdk.protocol.common import TopicPartition
from sdk.protocol.coordinator import ProducerTransactionView
from sdk.protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
)
from sdk.protocol.server import internal_headers
from sdk.protocol.states import TransactionState

log = logging.getLogger("eos.node.verification")


class TransactionVerifier(Protocol):
    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        """Raise unless the producer's current transaction includes ``tp``."""

    async def close(self) -> None: ...


class TrustingVerifier:
    """For a node run without a coordinator (tests of the node alone): accepts every batch."""

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        return None

    async def close(self) -> None:
        return None


class KeepAliveClient:
    """GETs over a pool of keep-alive HTTP/1.1 connections to one ``http://`` host.

    A connection is used by one request at a time and returned to the pool when its
    answer has been read in full. A GET on a pooled connection that the server closed
    meanwhile (the failure shows before any byte of an answer) is sent once more on a new
    connection; GETs are safe to repeat. Every failure is an ``OSError`` or ``TimeoutError``.
    """

    def __init__(
        self, base_url: str, headers: dict[str, str], *, timeout_s: float, max_idle: int = 64
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http URL: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        netloc = parts.netloc.rpartition("@")[2]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"HTTP/1.1\r\nhost: {netloc}\r\n{extra}accept: application/json\r\n\r\n"
        self._timeout_s = timeout_s
        self._max_idle = max_idle
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of ``GET path``."""
        request = f"GET {self._prefix}{path} {self._head}".encode()
        async with asyncio.timeout(self._timeout_s):
            while self._idle:
                conn = self._idle.pop()
                try:
                    return await self._exchange(conn, request)
                except _StaleConnection:
                    continue
            conn = await asyncio.open_connection(self._host, self._port)
            try:
                return await self._exchange(conn, request)
            except _StaleConnection as exc:
                raise ConnectionResetError("the coordinator closed the connection") from exc

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
    ) -> tuple[int, bytes]:
        reader, writer = conn
        reusable = False
        try:
            try:
                writer.write(request)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise ConnectionResetError("answer cut short") from exc
                raise _StaleConnection from exc
            lines = head[:-4].split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            fields: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                fields[name.strip().lower()] = value.strip().lower()
            if b"content-length" in fields:
                body = await reader.readexactly(int(fields[b"content-length"]))
                reusable = fields.get(b"connection") != b"close"
            elif fields.get(b"transfer-encoding") == b"chunked":
                body = await self._chunked(reader)
                reusable = fields.get(b"connection") != b"close"
            else:
                body = await reader.read()
            return status, body
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("answer cut short") from exc
        finally:
            if reusable and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                writer.close()

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent to us
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class _StaleConnection(Exception):
    """A pooled connection failed before any byte of an answer: try a fresh one."""


class CoordinatorVerifier:
    """Asks the coordinator's internal producer view."""

    def __init__(
        self,
        coordinator_url: str | None,
        internal_token: str | None,
        *,
        timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.coordinator_url = coordinator_url.rstrip("/") if coordinator_url else None
        self._fast: KeepAliveClient | None = None
        if client is None and self.coordinator_url is not None:
            with contextlib.suppress(ValueError):
                self._fast = KeepAliveClient(
                    self.coordinator_url, internal_headers(internal_token), timeout_s=timeout_s
                )
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, headers=internal_headers(internal_token)
        )

    async def _ask(self, producer_id: int) -> tuple[int, bytes]:
        path = f"/internal/v1/producers/{producer_id}/transaction"
        try:
            if self._fast is not None:
                return await self._fast.get(path)
            response = await self._client.get(f"{self.coordinator_url}{path}")
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            raise CoordinatorNotAvailableError(
                f"coordinator unreachable: {exc or type(exc).__name__}"
            ) from exc
        return response.status_code, response.content

    async def verify(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        if self.coordinator_url is None:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL, so it cannot verify transactional batches"
            )
        status, content = await self._ask(producer_id)
        if status == 404:
            raise TransactionAbortableError(
                f"producer {producer_id} has no transaction at the coordinator"
            )
        if status != 200:
            raise CoordinatorNotAvailableError(
                f"coordinator answered {status} to the verification"
            )
        view = ProducerTransactionView.model_validate_json(content)
        if view.producer_epoch > producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} was fenced by epoch "
                f"{view.producer_epoch}"
            )
        if view.producer_epoch < producer_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {producer_epoch} is ahead of the coordinator's "
                f"{view.producer_epoch}"
            )
        if view.state is not TransactionState.ONGOING or tp not in view.partitions:
            raise TransactionAbortableError(
                f"{tp.topic}-{tp.partition} was not added to the transaction of producer "
                f"{producer_id} (state {view.state.value})"
            )

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        await self._client.aclose()
