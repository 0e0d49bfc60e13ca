"""The marker channel's keep-alive HTTP/1.1 link, against a scripted server: connections
are reused, a connection the node closed is replaced without the caller noticing, chunked
answers are read, and an unreachable node is an httpx transport error (retried by the
channel like any other)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from coordinator_service.node_link import KeepAliveLink, node_link
from tests.support.processes import free_port

Reply = Callable[[int, bytes], bytes]


async def _serve(reply: Reply) -> tuple[asyncio.Server, list[int], list[bytes]]:
    """A server answering each request with ``reply(connection number, body)``."""
    connections: list[int] = []
    bodies: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(connections)
        connections.append(number)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                bodies.append(body)
                answer = reply(number, body)
                if not answer:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections, bodies


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_connections_are_kept_alive_and_answers_read() -> None:
    async def test() -> None:
        server, connections, bodies = await _serve(lambda _n, body: _ok(b'{"echo":' + body + b"}"))
        port = server.sockets[0].getsockname()[1]
        link = KeepAliveLink(timeout_s=5)
        try:
            for i in range(5):
                status, body = await link.post_json(
                    f"http://127.0.0.1:{port}/internal/v1/markers", b"%d" % i,
                    {"Authorization": "Bearer t"},
                )
                assert (status, body) == (200, b'{"echo":%d}' % i)
            assert connections == [0] and bodies == [b"0", b"1", b"2", b"3", b"4"]
        finally:
            await link.close()
            server.close()

    _run(test)


def test_a_connection_closed_by_the_node_is_replaced() -> None:
    async def test() -> None:
        # The first connection answers once, then closes on the next request.
        def reply(number: int, body: bytes) -> bytes:
            if number == 0 and body == b"second":
                return b""
            return _ok(body)

        server, connections, _ = await _serve(reply)
        port = server.sockets[0].getsockname()[1]
        link = KeepAliveLink(timeout_s=5)
        try:
            url = f"http://127.0.0.1:{port}/x"
            assert await link.post_json(url, b"first", {}) == (200, b"first")
            assert await link.post_json(url, b"second", {}) == (200, b"second")
            assert connections == [0, 1]
        finally:
            await link.close()
            server.close()

    _run(test)


def test_chunked_answers_and_unreachable_nodes() -> None:
    async def test() -> None:
        chunked = (
            b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n"
            b"4\r\nbusy\r\n3\r\n!!!\r\n0\r\n\r\n"
        )
        server, _, _ = await _serve(lambda _n, _b: chunked)
        port = server.sockets[0].getsockname()[1]
        link = KeepAliveLink(timeout_s=5)
        try:
            assert await link.post_json(f"http://127.0.0.1:{port}/", b"{}", {}) == (
                503, b"busy!!!",
            )
            with pytest.raises(httpx.TransportError):
                await link.post_json(f"http://127.0.0.1:{free_port()}/", b"{}", {})
        finally:
            await link.close()
            server.close()

    _run(test)


def test_https_nodes_and_injected_transports_use_httpx() -> None:
    async def test() -> None:
        seen: list[str] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(str(request.url))
            return httpx.Response(200, content=b"{}")

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            injected = node_link(client, transport_injected=True, timeout_s=5)
            assert await injected.post_json("http://node:1/m", b"{}", {}) == (200, b"{}")
            routed = node_link(client, transport_injected=False, timeout_s=5)
            assert await routed.post_json("https://node:2/m", b"{}", {}) == (200, b"{}")
            await routed.close()
        assert seen == ["http://node:1/m", "https://node:2/m"]

    _run(test)
