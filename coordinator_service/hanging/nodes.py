"""The detector's two calls to a storage node: its open transactions, and one marker.

Both go over the coordinator's HTTP client with the internal token, like the marker
channel's. A node that cannot be reached, answers an error or an unreadable body raises
``NodeCallFailed`` with what happened: the detector logs it, sets that node aside and
goes on with the others (one node down must not hide every other node's hanging
transactions, nor stop the aborts that can be made).

The marker is written here rather than through the marker channel: the channel carries
the decisions of transactional ids this instance owns and completes them with a
Complete* write, while a hanging transaction may belong to no id at all. One marker on one
partition, answered before the call returns, is also what an operator's abort is told.
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from eos_protocol.common import TopicPartition, read_answer_json
from eos_protocol.hanging import OpenTransaction, OpenTransactionsResponse
from eos_protocol.node import Marker, MarkerResult, WriteMarkersRequest, WriteMarkersResponse
from eos_protocol.paths import join
from eos_server.internal import internal_headers


class NodeCallFailed(Exception):
    """A node did not answer usably; the message says how (for the log)."""


class NodeCalls:
    def __init__(
        self, http: httpx.AsyncClient, nodes: dict[int, str], internal_token: str | None
    ) -> None:
        self._http = http
        self._nodes = nodes
        self._headers = internal_headers(internal_token)

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    def _url(self, node_id: int, *path: str) -> str:
        base = self._nodes.get(node_id)
        if base is None:
            raise NodeCallFailed(f"node {node_id} is not among this coordinator's nodes")
        return join(base, *path)

    async def _call(self, node_id: int, method: str, url: str, body: bytes | None) -> bytes:
        try:
            answer = await self._http.request(
                method, url, content=body,
                headers={**self._headers, "content-type": "application/json"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise NodeCallFailed(f"node {node_id} unreachable: {exc!r}") from exc
        if answer.status_code != 200:
            raise NodeCallFailed(
                f"node {node_id} answered {answer.status_code}: "
                f"{answer.content[:200].decode(errors='replace')}"
            )
        return answer.content

    async def open_transactions(self, node_id: int) -> OpenTransactionsResponse:
        url = self._url(node_id, "internal", "v1", "open-transactions")
        content = await self._call(node_id, "GET", url, None)
        try:
            return read_answer_json(OpenTransactionsResponse, content)
        except ValidationError as exc:
            raise NodeCallFailed(f"node {node_id} answered an unreadable body: {exc}") from exc

    async def open_on(
        self, node_id: int, topic: str, partition: int, producer_id: int
    ) -> OpenTransaction | None:
        """The producer's open transaction on that partition, asked of the node now."""
        answer = await self.open_transactions(node_id)
        for txn in answer.open_transactions:
            if (txn.topic, txn.partition, txn.producer_id) == (topic, partition, producer_id):
                return txn
        return None

    async def write_marker(
        self,
        node_id: int,
        txn: OpenTransaction,
        result: MarkerResult,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> str | None:
        """Write one marker for ``txn``'s producer on its partition; the node's error code
        for that partition (None: written, or nothing was open any more)."""
        marker = Marker(
            producer_id=txn.producer_id, producer_epoch=producer_epoch,
            coordinator_epoch=max(0, coordinator_epoch), result=result,
            partitions=[TopicPartition(topic=txn.topic, partition=txn.partition)],
        )  # fmt: skip
        body = WriteMarkersRequest(markers=[marker]).model_dump_json().encode()
        content = await self._call(
            node_id, "POST", self._url(node_id, "internal", "v1", "markers"), body
        )
        try:
            answer = read_answer_json(WriteMarkersResponse, content)
        except ValidationError as exc:
            raise NodeCallFailed(f"node {node_id} answered an unreadable body: {exc}") from exc
        for item in answer.results:
            if (item.topic, item.partition) == (txn.topic, txn.partition):
                return item.error
        raise NodeCallFailed(f"node {node_id} did not answer for {txn.topic}/{txn.partition}")
