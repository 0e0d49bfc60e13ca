"""The marker channel's choice of link: plain ``http://`` nodes go through the shared
keep-alive client (its own tests are tests/test_keepalive.py), ``https://`` nodes and an
injected transport through httpx; all of them as a JSON POST."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from coordinator_service.cluster.node_link import node_link
from tests.support.processes import free_port


@pytest.mark.unit
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

    asyncio.run(test())


def test_plain_http_nodes_get_a_json_post_over_keep_alive() -> None:
    async def test() -> None:
        heads: list[bytes] = []
        connections = 0

        async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    heads.append(head)
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    body = await reader.readexactly(length)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(body), body))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(node, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/internal/v1/markers"

        def refuse(request: httpx.Request) -> httpx.Response:
            raise AssertionError(f"httpx was used for {request.url}")

        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            link = node_link(client, transport_injected=False, timeout_s=5)
            try:
                for i in range(3):
                    assert await link.post_json(
                        url, b'{"n":%d}' % i, {"Authorization": "Bearer t"}
                    ) == (200, b'{"n":%d}' % i)
                with pytest.raises(httpx.TransportError):  # what the channel retries
                    await link.post_json(f"http://127.0.0.1:{free_port()}/m", b"{}", {})
            finally:
                await link.close()
                server.close()
        assert connections == 1
        assert b"content-type: application/json\r\n" in heads[0]
        assert b"Authorization: Bearer t\r\n" in heads[0]

    asyncio.run(test())
