"""Pushing a changed partition state to its replicas (Kafka's LeaderAndIsr), so that a
failover does not wait for the nodes' next heartbeat.

Heartbeat answers carry every state anyway (design §7: nodes pull their roles, and a lost
message is repaired by the next beat), so a push is only a shortcut and is sent once,
best effort: a node that is down, slow, or of a version without the endpoint simply
learns the state from its next heartbeat. A node ignores a state older than the one it
holds (a lower partition epoch), so a push racing a heartbeat answer is harmless.

States go to a node in batches, ``PUT /internal/v1/partition-states`` (``PartitionState``
entries plus every node's URL). A topic's creation or a node's failover changes thousands
of states within moments, and one request per state and replica was thousands of
requests. The pusher coalesces without waiting on a timer: the first state for a node is
sent as soon as the event loop runs again, with whatever else was pushed in the same turn;
while a request to a node is in flight, the states for it gather (the latest of each
partition wins) and leave together as soon as it is answered. A failover is thus told at
once, and a flood of changes costs about one request per node per round trip.

A node that answers the batch with 404 or 405 (a version without it, during a rolling
upgrade) is sent each state on its own, ``PUT
/internal/v1/partitions/{topic}/{partition}/state`` (the ``PartitionState`` without topic
and partition, plus the nodes' URLs), for ``SINGLY_FOR_S``; then the batch is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import httpx
import orjson

from coordinator_service.controller.partition_state import PartitionKey, StoredPartition
from eos_protocol.common import read_answer_json
from eos_protocol.paths import join
from eos_protocol.replication import (
    MAX_STATES_PER_PUSH,
    PartitionStatePush,
    PartitionStatesAnswer,
)
from eos_server.internal import internal_headers

log = logging.getLogger("eos.coordinator.controller")

#: How long a node without the batched push (an older version) is sent one state per
#: request before the batch is tried again (it may have been upgraded since).
SINGLY_FOR_S = 60.0
#: The answers of a node that does not serve ``PUT /internal/v1/partition-states``.
_NOT_SERVED = frozenset({404, 405})


def _newest(held: StoredPartition | None, state: StoredPartition) -> StoredPartition:
    """The later of two states of one partition: every change bumps the partition epoch,
    so the higher one is newer whatever order the callbacks ran in."""
    if held is not None and held.partition_epoch > state.partition_epoch:
        return held
    return state


class StatePusher:
    """Sends changed states to the partitions' replicas in the background, one batch per
    node at a time."""

    def __init__(
        self, client: httpx.AsyncClient, *, nodes: dict[int, str], internal_token: str | None
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._headers = {**internal_headers(internal_token), "content-type": "application/json"}
        self._tasks: set[asyncio.Task[None]] = set()
        # states waiting for their node's next request, the latest of each partition
        self._pending: dict[int, dict[PartitionKey, StoredPartition]] = {}
        # nodes whose sender task runs (it sends their ``_pending`` states until none are
        # left): a state pushed meanwhile waits for the request in flight to end
        self._senders: set[int] = set()
        # nodes without the batched push, and until when (monotonic) they are sent singly
        self._singly_until: dict[int, float] = {}

    def push(self, state: StoredPartition) -> None:
        """Send ``state`` to every replica this coordinator knows, without waiting."""
        for node in state.replicas:
            if node not in self._nodes:
                continue
            waiting = self._pending.setdefault(node, {})
            waiting[state.key] = _newest(waiting.get(state.key), state)
            if node not in self._senders:
                task = asyncio.create_task(self._drain(node), name=f"state-push-{node}")
                self._senders.add(node)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _drain(self, node: int) -> None:
        """Send the node's waiting states until none are left. The task's first step runs
        in the loop's next turn, so the states pushed in this one leave together."""
        try:
            while waiting := self._pending.pop(node, None):
                await self._send(node, list(waiting.values()))
        finally:
            self._senders.discard(node)

    async def deliver(self, states: list[StoredPartition]) -> None:
        """Send ``states`` to their replicas and wait for the answers (best effort, as
        ``push``). A new topic's replicated partitions are led by no node until their
        assignment arrives; delivered before the creation is answered, a produce that
        follows the answer at once finds its leader ready."""
        by_node: dict[int, list[StoredPartition]] = {}
        for state in states:
            for node in state.replicas:
                if node in self._nodes:
                    by_node.setdefault(node, []).append(state)
        await asyncio.gather(*(self._send(node, group) for node, group in by_node.items()))

    async def _send(self, node: int, states: list[StoredPartition]) -> None:
        """One node's states, in batches of ``MAX_STATES_PER_PUSH``, or one by one to a
        node without the batch."""
        for start in range(0, len(states), MAX_STATES_PER_PUSH):
            chunk = states[start:start + MAX_STATES_PER_PUSH]
            if self._sent_singly(node) or not await self._send_batch(node, chunk):
                await asyncio.gather(*(self._send_one(node, state) for state in chunk))

    def _sent_singly(self, node: int) -> bool:
        until = self._singly_until.get(node)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._singly_until[node]
        return False

    async def _send_batch(self, node: int, states: list[StoredPartition]) -> bool:
        """Push ``states`` in one request; False when the node does not serve it (it is
        then remembered for ``SINGLY_FOR_S``), True otherwise, answered or not."""
        body = {"nodes": self._nodes, "states": [s.wire().model_dump(mode="json") for s in states]}
        try:
            url = join(self._nodes[node], "internal", "v1", "partition-states")
            response = await self._client.put(
                url, content=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
                headers=self._headers,
            )
        except Exception as exc:  # best effort: the next heartbeat carries them
            log.debug("push of %d states to node %d failed: %s", len(states), node, exc)
            return True
        if response.status_code in _NOT_SERVED:
            self._singly_until[node] = time.monotonic() + SINGLY_FOR_S
            log.info("node %d takes no batched partition states (HTTP %d): sending them one "
                     "at a time", node, response.status_code)  # fmt: skip
            return False
        if response.status_code != 200:
            log.debug("node %d took no push of %d states (HTTP %d)", node, len(states),
                      response.status_code)  # fmt: skip
            return True
        try:
            answers = read_answer_json(PartitionStatesAnswer, response.content).states
        except ValueError:
            log.debug("node %d answered a push of %d states unreadably", node, len(states))
            return True
        _log_not_applied(node, [(a.topic, a.partition) for a in answers if not a.applied])
        return True

    def _content(self, state: StoredPartition) -> bytes:
        wire = state.wire()
        push = PartitionStatePush(
            leader=wire.leader, leader_epoch=wire.leader_epoch,
            partition_epoch=wire.partition_epoch, replicas=wire.replicas, isr=wire.isr,
            min_insync_replicas=wire.min_insync_replicas, retention_ms=wire.retention_ms,
            retention_bytes=wire.retention_bytes, nodes=self._nodes,
        )  # fmt: skip
        return orjson.dumps(push.model_dump(mode="json"))

    async def _send_one(self, node: int, state: StoredPartition) -> None:
        try:
            url = join(self._nodes[node], "internal", "v1", "partitions", state.topic,
                       state.partition, "state")  # fmt: skip
            response = await self._client.put(
                url, content=self._content(state), headers=self._headers
            )
            if response.status_code != 200:
                log.debug("node %d took no push of %s/%d (HTTP %d)", node, state.topic,
                          state.partition, response.status_code)
        except Exception as exc:  # best effort: the next heartbeat carries it
            log.debug("push of %s/%d to node %d failed: %s", state.topic, state.partition,
                      node, exc)

    async def settle(self) -> None:
        """Wait until every state pushed so far has been sent (answered or failed)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _log_not_applied(node: int, keys: Iterable[PartitionKey]) -> None:
    """States a node did not take (older than its own, or a partition it lacks yet): the
    heartbeat settles them; said at debug level, as a push is only a shortcut."""
    skipped = list(keys)
    if skipped:
        log.debug("node %d did not apply %d pushed states (first: %s/%d)", node, len(skipped),
                  *skipped[0])  # fmt: skip
