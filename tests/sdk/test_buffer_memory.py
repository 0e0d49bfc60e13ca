"""A producer's buffer is bounded (Kafka's ``buffer.memory``): while the records queued and
not yet acknowledged fill ``buffer_memory``, ``send`` waits for room, at most
``max_block_ms``, then raises ``EosTimeoutError`` and queues nothing; acknowledgements free
room and sends go on. Both twins, against the real cluster, with the node's answers held
back at the transport seam (a retriable NOT_ENOUGH_REPLICAS, as a leader short of in-sync
replicas answers)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from sdk import EosTimeoutError, RetryConfig
from tests.sdk.conftest import Twin
from tests.sdk.faults import is_produce
from tests.sdk.helpers import read_topic, uid, wait_for
from tests.support.cluster import Cluster

FAST = RetryConfig(backoff_ms=5, backoff_max_ms=50, request_timeout_ms=10_000)
VALUE = "x" * 400
PER_RECORD = len(VALUE) + 40  # the accumulator's estimate: value plus JSON overhead
BUFFER = 4_000


class Gate:
    """Holds every produce back (NOT_ENOUGH_REPLICAS) while closed."""

    def __init__(self) -> None:
        self.closed = True
        self.held = 0

    def __call__(self, request: httpx.Request) -> str | None:
        if self.closed and is_produce(request):
            self.held += 1
            return "NOT_ENOUGH_REPLICAS"
        return None


def _gated_producer(twin: Twin, cluster: Cluster, *, max_block_ms: int) -> tuple[str, Gate, Any]:
    """A fresh one-partition topic, a closed ``Gate`` and a producer of ``BUFFER`` bytes
    whose produce requests pass through the gate."""
    topic = cluster.create_topic(partitions=1)
    gate = Gate()
    server = twin.faulty(gate)
    producer = twin.producer(
        cluster.url, buffer_memory=BUFFER, max_block_ms=max_block_ms, batch_size=1_000,
        linger_ms=0, retry=FAST, delivery_timeout_ms=20_000,
        transport=server.transport(twin.kind),
    )  # fmt: skip
    return topic, gate, producer


def test_a_full_buffer_times_out_a_send_and_loses_nothing_acknowledged(
    twin: Twin, cluster: Cluster
) -> None:
    topic, gate, producer = _gated_producer(twin, cluster, max_block_ms=1_000)
    futures = []
    with pytest.raises(EosTimeoutError, match="buffer"):
        for _ in range(100):
            futures.append(producer.send(topic, VALUE, partition=0))
    assert gate.held > 0, "the node's answers were never held back"
    # what fits in the buffer was queued, and not one record more
    assert BUFFER // PER_RECORD <= len(futures) <= BUFFER // PER_RECORD + 1

    gate.closed = False  # the node answers again: the retries free the buffer
    futures += [producer.send(topic, VALUE, partition=0) for _ in range(20)]
    producer.flush()
    assert [f.result().offset for f in futures] == list(range(len(futures)))
    records = read_topic(cluster.url, topic, 1, expect=len(futures))
    assert len(records) == len(futures)  # the timed-out send left nothing behind


def test_a_blocked_send_goes_on_when_answers_free_room(cluster: Cluster, twin: Twin) -> None:
    topic, gate, producer = _gated_producer(twin, cluster, max_block_ms=30_000)
    # one record past what fits: the buffer is full
    queued = [producer.send(topic, VALUE, partition=0) for _ in range(BUFFER // PER_RECORD + 1)]
    outcome: list[object] = []

    def blocked_send() -> None:
        try:
            outcome.append(producer.send(topic, f"after-{uid('r')}", partition=0))
        except Exception as exc:  # recorded for the assertion below
            outcome.append(exc)

    sender = threading.Thread(target=blocked_send, daemon=True)
    sender.start()
    wait_for(lambda: gate.held >= 3, timeout=20, what="the node's answers held back")
    assert sender.is_alive() and not outcome, "a send into a full buffer must wait"
    gate.closed = False
    sender.join(timeout=20)
    assert not sender.is_alive(), "the blocked send never went on"
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    producer.flush()
    assert [f.result().offset for f in queued] == list(range(len(queued)))
    records = read_topic(cluster.url, topic, 1, expect=len(queued) + 1)
    assert str(records[-1].value).startswith("after-")


def test_buffer_memory_must_be_positive(cluster: Cluster, twin: Twin) -> None:
    with pytest.raises(ValueError, match="buffer_memory"):
        twin.producer(cluster.url, buffer_memory=0)
