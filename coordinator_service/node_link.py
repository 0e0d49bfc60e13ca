"""How the marker channel talks to storage nodes: one small POST per batch of markers.

Markers go out several hundred times a second under load, each time a small JSON request
on a connection the node keeps alive. httpx spends more of the coordinator's CPU on such a
request (its pool bookkeeping, header models, event machinery) than the coordinator spends
deciding the transaction, so plain ``http://`` nodes are reached through
``KeepAliveLink``: a minimal HTTP/1.1 client holding a few keep-alive connections per node.
``HttpxLink`` keeps httpx for everything else — an injected transport (tests stand in for
nodes that way) or ``https://`` nodes.

Both raise ``httpx.TransportError`` subclasses for a node that cannot be reached or that
broke off an answer, so the channel's retry policy is the same whichever link is used.
Re-sending markers is harmless, which is what makes the one silent retry below safe: a
request on a pooled connection that the node had closed meanwhile is sent again once on a
new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol
from urllib.parse import urlsplit

import httpx

Answer = tuple[int, bytes]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class NodeLink(Protocol):
    async def post_json(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body`` (JSON) to ``url``: (status, answer body)."""

    async def close(self) -> None: ...


class HttpxLink:
    """Through an ``httpx.AsyncClient`` (owned by the app, not closed here)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post_json(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        response = await self._client.post(
            url, content=body, headers={**headers, "content-type": "application/json"}
        )
        return response.status_code, response.content

    async def close(self) -> None:
        return None


class _Stale(Exception):
    """A pooled connection failed before any byte of an answer."""


class KeepAliveLink:
    """Plain HTTP/1.1 with keep-alive connections pooled per ``host:port``.

    Answers must carry ``content-length`` (uvicorn's do for every JSON answer) or close the
    connection; chunked answers are read too. Anything else about the answer is left to
    the caller (status and body).
    """

    def __init__(self, *, timeout_s: float, max_idle_per_node: int = 4) -> None:
        self._timeout_s = timeout_s
        self._max_idle = max_idle_per_node
        self._idle: dict[tuple[str, int], list[Connection]] = {}

    @staticmethod
    def supports(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname)

    async def post_json(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"not a plain http URL: {url!r}")
        key = (parts.hostname, parts.port or 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (
            f"POST {target} HTTP/1.1\r\nhost: {parts.netloc.rpartition('@')[2]}\r\n{extra}"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            async with asyncio.timeout(self._timeout_s):
                idle = self._idle.setdefault(key, [])
                while idle:
                    try:
                        return await self._exchange(key, idle.pop(), head, body)
                    except _Stale:
                        continue
                conn = await asyncio.open_connection(*key)
                try:
                    return await self._exchange(key, conn, head, body)
                except _Stale as exc:
                    raise ConnectionResetError("the node closed the connection") from exc
        except TimeoutError as exc:
            raise httpx.TimeoutException(f"no answer from {url} in time") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{url}: {exc or type(exc).__name__}") from exc

    async def _exchange(
        self, key: tuple[str, int], conn: Connection, head: bytes, body: bytes
    ) -> Answer:
        reader, writer = conn
        reusable = False
        try:
            try:
                writer.writelines([head, body])
                await writer.drain()
                answer_head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise ConnectionResetError("answer cut short") from exc
                raise _Stale from exc
            lines = answer_head[:-4].split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            fields: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                fields[name.strip().lower()] = value.strip().lower()
            keep = fields.get(b"connection") != b"close"
            if b"content-length" in fields:
                content = await reader.readexactly(int(fields[b"content-length"]))
                reusable = keep
            elif fields.get(b"transfer-encoding") == b"chunked":
                content = await _read_chunked(reader)
                reusable = keep
            else:
                content = await reader.read()
            return status, content
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("answer cut short") from exc
        finally:
            idle = self._idle.setdefault(key, [])
            if reusable and len(idle) < self._max_idle:
                idle.append(conn)
            else:
                writer.close()

    async def close(self) -> None:
        pools, self._idle = self._idle, {}
        for idle in pools.values():
            for _, writer in idle:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


class RoutingLink:
    """``KeepAliveLink`` for plain http URLs, ``HttpxLink`` for the rest."""

    def __init__(self, fast: KeepAliveLink, fallback: HttpxLink) -> None:
        self._fast = fast
        self._fallback = fallback

    async def post_json(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        link: NodeLink = self._fast if self._fast.supports(url) else self._fallback
        return await link.post_json(url, body, headers)

    async def close(self) -> None:
        await self._fast.close()
        await self._fallback.close()


def node_link(client: httpx.AsyncClient, *, transport_injected: bool, timeout_s: float) -> NodeLink:
    """The link the marker channel should use."""
    if transport_injected:
        return HttpxLink(client)
    return RoutingLink(KeepAliveLink(timeout_s=timeout_s), HttpxLink(client))
