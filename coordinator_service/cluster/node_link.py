"""How the marker channel talks to storage nodes: one small POST per batch of markers.

Markers go out several hundred times a second under load, each time a small JSON request
on a connection the node keeps alive. httpx spends more of the coordinator's CPU on such a
request than the coordinator spends deciding the transaction, so ``RoutingLink`` sends
to plain ``http://`` nodes through the services' shared keep-alive HTTP/1.1 client
(``eos_server/keepalive.py``). ``HttpxLink`` keeps httpx for everything else — an
injected transport (tests stand in for nodes that way) or ``https://`` nodes.

Both raise ``httpx.TransportError`` subclasses for a node that cannot be reached or that
broke off an answer, so the channel's retry policy is the same whichever link is used.
Re-sending markers is harmless, which is what makes the shared client's one silent retry
safe: a request on a pooled connection that the node had closed meanwhile is sent again
once on a new connection.
"""

from __future__ import annotations

from typing import Protocol

import httpx

from eos_server.keepalive import Answer, KeepAliveClient

MAX_IDLE_PER_NODE = 4  # one marker request per node is in flight at a time


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


class RoutingLink:
    """The shared keep-alive client for plain http URLs, ``HttpxLink`` for the rest."""

    def __init__(self, fast: KeepAliveClient, fallback: HttpxLink) -> None:
        self._fast = fast
        self._fallback = fallback

    async def post_json(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        if self._fast.supports(url):
            return await self._fast.request(
                "POST", url, body, {**headers, "content-type": "application/json"}
            )
        return await self._fallback.post_json(url, body, headers)

    async def close(self) -> None:
        await self._fast.close()
        await self._fallback.close()


def node_link(client: httpx.AsyncClient, *, transport_injected: bool, timeout_s: float) -> NodeLink:
    """The link the marker channel should use."""
    if transport_injected:
        return HttpxLink(client)
    return RoutingLink(
        KeepAliveClient(timeout_s=timeout_s, max_idle_per_host=MAX_IDLE_PER_NODE),
        HttpxLink(client),
    )
