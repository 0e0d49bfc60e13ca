"""Pushing a changed partition state to its replicas (Kafka's LeaderAndIsr), so that a
failover does not wait for the nodes' next heartbeat.

Heartbeat answers carry every state anyway (design §7: nodes pull their roles, and a lost
message is repaired by the next beat), so a push is only a shortcut and is sent once,
best effort: a node that is down, slow, or of a version without the endpoint (404) simply
learns the state from its next heartbeat. A node ignores a state older than the one it
holds (a lower partition epoch), so a push racing a heartbeat answer is harmless.

``PUT /internal/v1/partitions/{topic}/{partition}/state`` takes the ``PartitionState``
without the topic and partition (they are in the path), plus every node's URL.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson

from coordinator_service.partition_state import StoredPartition
from eos_protocol.paths import join
from eos_protocol.replication import PartitionStatePush
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.controller")


class StatePusher:
    """Sends each changed state to the partition's replicas in the background."""

    def __init__(
        self, client: httpx.AsyncClient, *, nodes: dict[int, str], internal_token: str | None
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._headers = {**internal_headers(internal_token), "content-type": "application/json"}
        self._tasks: set[asyncio.Task[None]] = set()

    def _content(self, state: StoredPartition) -> bytes:
        wire = state.wire()
        push = PartitionStatePush(
            leader=wire.leader, leader_epoch=wire.leader_epoch,
            partition_epoch=wire.partition_epoch, replicas=wire.replicas, isr=wire.isr,
            min_insync_replicas=wire.min_insync_replicas, retention_ms=wire.retention_ms,
            retention_bytes=wire.retention_bytes, nodes=self._nodes,
        )  # fmt: skip
        return orjson.dumps(push.model_dump(mode="json"))

    def push(self, state: StoredPartition) -> None:
        """Send ``state`` to every replica this coordinator knows, without waiting."""
        content = self._content(state)
        for node in state.replicas:
            base = self._nodes.get(node)
            if base is None:
                continue
            task = asyncio.create_task(self._send(base, state, node, content))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def deliver(self, states: list[StoredPartition]) -> None:
        """Send ``states`` to their replicas and wait for the answers (best effort, as
        ``push``). A new topic's replicated partitions are led by no node until their
        assignment arrives; delivered before the creation is answered, a produce that
        follows the answer at once finds its leader ready."""
        sends = []
        for state in states:
            content = self._content(state)
            for node in state.replicas:
                base = self._nodes.get(node)
                if base is not None:
                    sends.append(self._send(base, state, node, content))
        await asyncio.gather(*sends)

    async def _send(self, base: str, state: StoredPartition, node: int, content: bytes) -> None:
        try:
            url = join(base, "internal", "v1", "partitions", state.topic, state.partition,
                       "state")
            response = await self._client.put(url, content=content, headers=self._headers)
            if response.status_code != 200:
                log.debug("node %d took no push of %s/%d (HTTP %d)", node, state.topic,
                          state.partition, response.status_code)
        except Exception as exc:  # best effort: the next heartbeat carries it
            log.debug("push of %s/%d to node %d failed: %s", state.topic, state.partition,
                      node, exc)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
