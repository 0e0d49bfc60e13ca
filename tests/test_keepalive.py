"""The services' shared keep-alive HTTP/1.1 client (eos_server/keepalive.py), against a
scripted server: connections are pooled per host:port and reused, a connection the peer
closed is replaced without the caller noticing (once), content-length, chunked and
close-delimited answers are read, and every failure is an httpx transport error (which
the callers retry like any other)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from eos_server.keepalive import KeepAliveClient
from tests.support.processes import free_port

Reply = Callable[[int, bytes], bytes]


@dataclass
class Server:
    server: asyncio.Server
    connections: list[int] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def _serve(reply: Reply, close_after: Callable[[bytes], bool] = lambda _b: False) -> Server:
    """A server answering each request with ``reply(connection number, body)``; an empty
    reply closes the connection without answering, and so does ``close_after(body)`` once
    the reply is written (a peer closing a connection it kept alive)."""
    state = Server(server=None)  # type: ignore[arg-type]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(state.connections)
        state.connections.append(number)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                state.heads.append(head)
                state.bodies.append(body)
                answer = reply(number, body)
                if not answer:
                    break
                writer.write(answer)
                await writer.drain()
                if close_after(body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    state.server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return state


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_connections_are_kept_alive_and_answers_read() -> None:
    async def test() -> None:
        server = await _serve(lambda _n, body: _ok(b'{"echo":' + body + b"}"))
        client = KeepAliveClient(timeout_s=5)
        try:
            for i in range(5):
                status, body = await client.request(
                    "POST", f"{server.url}/internal/v1/markers?x=1", b"%d" % i,
                    {"Authorization": "Bearer t", "content-type": "application/json"},
                )
                assert (status, body) == (200, b'{"echo":%d}' % i)
            assert server.connections == [0]
            assert server.bodies == [b"0", b"1", b"2", b"3", b"4"]
            head = server.heads[0].decode()
            assert head.startswith("POST /internal/v1/markers?x=1 HTTP/1.1\r\n")
            assert f"host: {server.url.removeprefix('http://')}\r\n" in head
            assert "Authorization: Bearer t\r\n" in head
            assert "content-type: application/json\r\n" in head
            assert "content-length: 1\r\n" in head
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_gets_send_no_body_and_reuse_the_connection() -> None:
    async def test() -> None:
        server = await _serve(lambda _n, _b: _ok(b'{"state":"Ongoing"}'))
        client = KeepAliveClient(timeout_s=5)
        try:
            for _ in range(3):
                assert await client.request(
                    "GET", f"{server.url}/internal/v1/producers/7/transaction",
                    headers={"accept": "application/json"},
                ) == (200, b'{"state":"Ongoing"}')
            assert server.connections == [0] and server.bodies == [b""] * 3
            head = server.heads[0].decode()
            assert head.startswith("GET /internal/v1/producers/7/transaction HTTP/1.1\r\n")
            assert "content-length" not in head
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_pools_are_per_host_and_port_and_bounded() -> None:
    async def test() -> None:
        first = await _serve(lambda _n, body: _ok(body))
        second = await _serve(lambda _n, body: _ok(body))
        client = KeepAliveClient(timeout_s=5, max_idle_per_host=2)
        try:
            assert await client.request("POST", f"{first.url}/a", b"1") == (200, b"1")
            assert await client.request("POST", f"{second.url}/b", b"2") == (200, b"2")
            assert await client.request("POST", f"{first.url}/c", b"3") == (200, b"3")
            assert (first.connections, second.connections) == ([0], [0])
            # four at once need four connections; two of them are kept afterwards
            answers = await asyncio.gather(
                *(client.request("POST", f"{first.url}/d", b"%d" % i) for i in range(4))
            )
            assert answers == [(200, b"%d" % i) for i in range(4)]
            assert len(first.connections) == 4
            for i in range(4):
                await client.request("POST", f"{first.url}/e", b"%d" % i)
            assert len(first.connections) == 4  # no new connection for one at a time
            await asyncio.gather(
                *(client.request("POST", f"{first.url}/f", b"%d" % i) for i in range(3))
            )
            assert len(first.connections) == 5  # two pooled, a third one opened
        finally:
            await client.close()
            first.server.close()
            second.server.close()

    _run(test)


def test_a_connection_closed_by_the_peer_is_replaced() -> None:
    async def test() -> None:
        # The first connection answers once, then closes on the next request unanswered.
        def reply(number: int, body: bytes) -> bytes:
            if number == 0 and body == b"second":
                return b""
            return _ok(body)

        server = await _serve(reply)
        client = KeepAliveClient(timeout_s=5)
        try:
            url = f"{server.url}/x"
            assert await client.request("POST", url, b"first") == (200, b"first")
            assert await client.request("POST", url, b"second") == (200, b"second")
            assert server.connections == [0, 1]
            assert server.bodies == [b"first", b"second", b"second"]  # sent again, once
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_an_idle_connection_the_peer_closed_is_not_used() -> None:
    async def test() -> None:
        # Each connection answers once and then closes while idle (a keep-alive timeout).
        server = await _serve(lambda _n, body: _ok(body), close_after=lambda _b: True)
        client = KeepAliveClient(timeout_s=5)
        exchanges = 0
        exchange = client._exchange

        async def counted(*args: Any) -> tuple[int, bytes]:
            nonlocal exchanges
            exchanges += 1
            return await exchange(*args)

        client._exchange = counted  # type: ignore[method-assign,assignment]
        try:
            url = f"{server.url}/x"
            assert await client.request("POST", url, b"first") == (200, b"first")
            await asyncio.sleep(0.05)  # the peer's close arrives while the connection idles
            assert await client.request("POST", url, b"second") == (200, b"second")
            assert server.connections == [0, 1]
            assert exchanges == 2  # nothing was sent on the closed connection
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_one_retry_only() -> None:
    async def test() -> None:
        # The first connection answers once; every later request is closed unanswered.
        def reply(number: int, body: bytes) -> bytes:
            return _ok(body) if number == 0 and body == b"first" else b""

        server = await _serve(reply)
        client = KeepAliveClient(timeout_s=5)
        try:
            url = f"{server.url}/x"
            assert await client.request("POST", url, b"first") == (200, b"first")
            with pytest.raises(httpx.ReadError):
                await client.request("POST", url, b"second")
            assert server.connections == [0, 1]  # the pooled one and one new, no more
            with pytest.raises(httpx.TransportError):  # a new connection is not retried
                await client.request("POST", url, b"third")
            assert server.connections == [0, 1, 2]
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_an_answer_cut_short_is_not_retried() -> None:
    async def test() -> None:
        # On a pooled connection: part of the body arrives, then the peer closes.
        def reply(_number: int, body: bytes) -> bytes:
            if body == b"first":
                return _ok(body)
            return b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"

        server = await _serve(reply, close_after=lambda body: body != b"first")
        client = KeepAliveClient(timeout_s=5)
        try:
            url = f"{server.url}/x"
            assert await client.request("POST", url, b"first") == (200, b"first")
            with pytest.raises(httpx.RemoteProtocolError):
                await client.request("POST", url, b"second")
            # a head cut short is no better
            with pytest.raises(httpx.RemoteProtocolError):
                await client.request("POST", url, b"third")
            assert server.bodies == [b"first", b"second", b"third"]  # each sent once
        finally:
            await client.close()
            server.server.close()

        # Part of the body arrives, the rest never does: the deadline ends the request.
        stalled = await _serve(lambda _n, _b: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        client = KeepAliveClient(timeout_s=0.3)
        try:
            with pytest.raises(httpx.ReadTimeout):
                await client.request("POST", f"{stalled.url}/x", b"1")
            assert stalled.bodies == [b"1"]
        finally:
            await client.close()
            stalled.server.close()

    _run(test)


def test_chunked_and_close_delimited_answers() -> None:
    async def test() -> None:
        chunked = (
            b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n"
            b"4\r\nbusy\r\n3;ext=1\r\n!!!\r\n0\r\nx-trailer: 1\r\n\r\n"
        )
        server = await _serve(lambda _n, _b: chunked)
        client = KeepAliveClient(timeout_s=5)
        try:
            for _ in range(2):
                assert await client.request("POST", f"{server.url}/", b"{}") == (
                    503, b"busy!!!",
                )
            assert server.connections == [0]
        finally:
            await client.close()
            server.server.close()

        # no length: the answer ends with the connection, which is not pooled
        unframed = await _serve(
            lambda _n, _b: b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close_after=lambda _b: True
        )
        client = KeepAliveClient(timeout_s=5)
        try:
            for _ in range(2):
                assert await client.request("GET", f"{unframed.url}/") == (200, b"until the end")
            assert unframed.connections == [0, 1]
        finally:
            await client.close()
            unframed.server.close()

    _run(test)


def test_connection_close_answers_are_not_pooled() -> None:
    async def test() -> None:
        server = await _serve(lambda _n, body: _ok(body, b"connection: close\r\n"))
        client = KeepAliveClient(timeout_s=5)
        try:
            for i in range(3):
                assert await client.request("POST", f"{server.url}/", b"%d" % i) == (
                    200, b"%d" % i,
                )
            assert server.connections == [0, 1, 2]
        finally:
            await client.close()
            server.server.close()

    _run(test)


def test_failures_are_httpx_transport_errors() -> None:
    async def test() -> None:
        client = KeepAliveClient(timeout_s=5)
        try:
            with pytest.raises(httpx.ConnectError):
                await client.request("POST", f"http://127.0.0.1:{free_port()}/", b"{}")
            with pytest.raises(httpx.UnsupportedProtocol):
                await client.request("GET", "https://127.0.0.1/")
            garbage = await _serve(lambda _n, _b: b"SSH-2.0-OpenSSH\r\n\r\n")
            with pytest.raises(httpx.RemoteProtocolError):
                await client.request("GET", f"{garbage.url}/")
            garbage.server.close()
            for framing in (b"content-length: -1\r\n", b"transfer-encoding: chunked\r\n"):
                bad = await _serve(lambda _n, _b, f=framing: b"HTTP/1.1 200 OK\r\n%s\r\nzz\r\n" % f)
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.request("GET", f"{bad.url}/")
                bad.server.close()
        finally:
            await client.close()

        async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read()  # never answers; ends when the client gives up
            finally:
                writer.close()

        mute = await asyncio.start_server(never, "127.0.0.1", 0)
        client = KeepAliveClient(timeout_s=0.2)
        try:
            with pytest.raises(httpx.ReadTimeout):
                await client.request(
                    "GET", f"http://127.0.0.1:{mute.sockets[0].getsockname()[1]}/"
                )
        finally:
            await client.close()
            mute.close()

    _run(test)


def test_supports_plain_http_only() -> None:
    assert KeepAliveClient.supports("http://node-1:9091/internal/v1/markers")
    assert KeepAliveClient.supports("http://127.0.0.1/")
    assert not KeepAliveClient.supports("https://node-1:9091/")
    assert not KeepAliveClient.supports("http:///no-host")
    assert not KeepAliveClient.supports("unix:///tmp/sock")
