"""A minimal keep-alive HTTP/1.1 client for the services' calls to each other.

Two internal calls are made several hundred times a second under load, each a small request
on a connection the peer keeps alive: the coordinator's marker POSTs to storage nodes
(``coordinator_service/cluster/node_link.py``) and a storage node's KIP-890 verification GET to the
coordinator (``partition_service/verification.py``). Through httpx, the client's own work
per request (pool bookkeeping that checks every idle connection, header models, event
machinery) cost more CPU than the work the request asked for: more than the coordinator
spent deciding the transaction, more than the node spent appending the batch.
``bench/bench_internal_client.py`` measures this client against ``httpx.AsyncClient``,
httpcore alone and h11 over asyncio streams, on the same requests to the same server;
``bench/bench_coordinator.py`` measures the path these calls sit on. The benchmarks send
their load through this client as well (``bench/harness.py``), for the same reason.

``KeepAliveClient`` does only what those calls need: plain ``http://`` URLs, a LIFO pool of
keep-alive connections per ``host:port``, answers delimited by ``content-length`` or
chunked (or by the peer closing the connection), one deadline per request. Callers keep
httpx for anything else (``supports`` says which): ``https://`` peers, or an httpx
transport injected by tests.

Failures are ``httpx.TransportError`` subclasses — ``ConnectError``, ``ReadError``,
``RemoteProtocolError``, ``ConnectTimeout``/``ReadTimeout``, ``UnsupportedProtocol`` — as
httpx would raise them, so a caller's retry policy is the same whichever client answered.

A request sent on a pooled connection that the peer had closed meanwhile (its keep-alive
timeout, a restart) fails before any byte of an answer arrives; it is sent once more, on a
new connection, without the caller noticing. The peer may have read the first copy before
closing, so only requests that are safe to repeat belong here: both callers' are (a marker
written twice is harmless, the GET reads).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

Answer = tuple[int, bytes]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
HostPort = tuple[str, int]

_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_NO_HEADERS: Mapping[str, str] = {}


class _Stale(Exception):
    """A pooled connection failed before any byte of an answer: try a new one."""


class _Broken(Exception):
    """The answer was cut short or is not HTTP/1.x: ``httpx.RemoteProtocolError``."""


class KeepAliveClient:
    """Plain HTTP/1.1 with keep-alive connections pooled per ``host:port``.

    A connection carries one request at a time and goes back to its pool once its answer
    has been read in full, unless the answer said ``connection: close``; a pool keeps at
    most ``max_idle_per_host`` connections. ``timeout_s`` bounds a whole request: connect,
    send and the complete answer, a silent retry included. Status and body are returned
    as they are; what they mean is the caller's business.
    """

    def __init__(self, *, timeout_s: float, max_idle_per_host: int = 8) -> None:
        self._timeout_s = timeout_s
        self._max_idle = max_idle_per_host
        self._idle: dict[HostPort, list[Connection]] = {}
        self._closed = False

    @staticmethod
    def supports(url: str) -> bool:
        """Whether ``url`` is for this client (plain ``http://`` with a host)."""
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname)

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: Mapping[str, str] = _NO_HEADERS,
    ) -> Answer:
        """(status, body) of the answer to ``method url``."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"not a plain http URL: {url!r}")
        try:
            key = (parts.hostname, parts.port or 80)
        except ValueError as exc:  # a port out of range
            raise httpx.UnsupportedProtocol(f"{url!r}: {exc}") from exc
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        lines = [f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc.rpartition('@')[2]}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if body or method not in _NO_BODY_METHODS:
            lines.append(f"content-length: {len(body)}\r\n")
        lines.append("\r\n")
        message = "".join(lines).encode("latin-1") + body
        head_only = method == "HEAD"
        connecting = False
        try:
            async with asyncio.timeout(self._timeout_s):
                idle = self._idle.get(key)
                while idle:
                    conn = idle.pop()
                    if conn[0].at_eof() or conn[1].is_closing():
                        conn[1].close()  # closed by the peer while idle: nothing sent yet
                        continue
                    try:
                        return await self._exchange(key, conn, message, head_only)
                    except _Stale:
                        break  # the one retry, on a new connection
                connecting = True
                conn = await asyncio.open_connection(*key)
                connecting = False
                try:
                    return await self._exchange(key, conn, message, head_only)
                except _Stale as exc:
                    raise httpx.ReadError(f"{url}: the peer closed the connection") from exc
        except TimeoutError as exc:
            timeout = httpx.ConnectTimeout if connecting else httpx.ReadTimeout
            raise timeout(f"no answer from {url} within {self._timeout_s} s") from exc
        except _Broken as exc:
            raise httpx.RemoteProtocolError(f"{url}: {exc}") from exc
        except OSError as exc:
            error = httpx.ConnectError if connecting else httpx.ReadError
            raise error(f"{url}: {exc or type(exc).__name__}") from exc

    async def _exchange(
        self, key: HostPort, conn: Connection, message: bytes, head_only: bool
    ) -> Answer:
        reader, writer = conn
        reusable = False
        try:
            try:
                writer.write(message)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _Broken("the answer's head was cut short") from exc
                raise _Stale from exc
            except ConnectionError as exc:
                raise _Stale from exc
            status, keep, fields = _parse_head(head)
            while 100 <= status < 200:  # interim answers (none are asked for): skip them
                if status == 101:
                    raise _Broken("the peer switched protocols")
                status, keep, fields = _parse_head(await reader.readuntil(b"\r\n\r\n"))
            if head_only or status in (204, 304):
                content = b""
                reusable = keep
            elif b"content-length" in fields:
                length = fields[b"content-length"]
                if not length.isdigit():
                    raise _Broken(f"a bad content-length: {length[:20]!r}")
                content = await reader.readexactly(int(length))
                reusable = keep
            elif fields.get(b"transfer-encoding", b"").endswith(b"chunked"):
                content = await _read_chunked(reader)
                reusable = keep
            else:
                content = await reader.read()  # delimited by the peer closing
            return status, content
        except asyncio.IncompleteReadError as exc:
            raise _Broken("the answer was cut short") from exc
        except asyncio.LimitOverrunError as exc:
            raise _Broken("a line of the answer is too long") from exc
        finally:
            idle = self._idle.setdefault(key, [])
            if reusable and not self._closed and len(idle) < self._max_idle:
                idle.append(conn)
            else:
                writer.close()

    async def close(self) -> None:
        """Close the idle connections; those in use close when their answer is read."""
        self._closed = True
        pools, self._idle = self._idle, {}
        for idle in pools.values():
            for _, writer in idle:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


def _parse_head(head: bytes) -> tuple[int, bool, dict[bytes, bytes]]:
    """(status, whether the connection stays open, lower-cased fields) of an answer head."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise _Broken(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    fields: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    connection = fields.get(b"connection", b"")
    keep = connection == b"keep-alive" if version == b"HTTP/1.0" else connection != b"close"
    return int(code), keep, fields


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        digits = line.split(b";")[0].strip()
        if not digits or digits.strip(b"0123456789abcdefABCDEF"):
            raise _Broken(f"a bad chunk size: {line[:20]!r}")
        size = int(digits, 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
