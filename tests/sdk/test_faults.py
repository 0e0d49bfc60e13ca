"""Faults injected at the transport: lost answers after the node applied a produce, 503s,
timeouts. Retries must neither duplicate nor lose nor reorder a record, and the errors
that break a sequence must be handled as KIP-360 says. Blocking and async clients alike."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import httpx
import pytest

from sdk import (
    AdminClient,
    NetworkError,
    OutOfOrderSequenceNumberError,
    ProducerState,
    RetryConfig,
    UnknownProducerIdError,
)
from tests.sdk.conftest import Twin
from tests.sdk.faults import FaultyServer, is_produce, random_produce_faults
from tests.sdk.helpers import read_topic, uid
from tests.support.cluster import Cluster

FAST = RetryConfig(backoff_ms=5, backoff_max_ms=50, request_timeout_ms=10_000)
ALL_FAULTS = ["drop", "timeout_after", "timeout_before", "503", "bare503", "NOT_LEADER_OR_FOLLOWER"]


def _check_exactly_once_in_order(records: list[Any], sent: int, keys: int) -> None:
    by_key: dict[str, list[int]] = defaultdict(list)
    for record in records:
        by_key[record.key].append(int(record.value.split(":")[1]))
    assert sum(len(v) for v in by_key.values()) == sent, "a record was lost or duplicated"
    for key, numbers in by_key.items():
        assert numbers == sorted(set(numbers)), f"key {key}: reordered or duplicated"
    assert sorted(n for v in by_key.values() for n in v) == list(range(sent))
    assert len(by_key) == keys


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_produce_faults_never_duplicate_lose_or_reorder(
    twin: Twin, cluster: Cluster, transactional: bool
) -> None:
    topic = cluster.create_topic(partitions=3)
    server = twin.faulty(random_produce_faults(0.25, seed=7, actions=ALL_FAULTS))
    options = dict(linger_ms=2, batch_size=600, retry=FAST, transport=server.transport(twin.kind))
    sent, keys = 600, 6
    if transactional:
        producer = twin.transactional_producer(cluster.url, uid("tx"), **options)
        producer.init_transactions()
        producer.begin_transaction()
    else:
        producer = twin.producer(cluster.url, **options)
    futures = [producer.send(topic, f"k{i % keys}:{i}", key=f"k{i % keys}") for i in range(sent)]
    if transactional:
        producer.commit_transaction()
    else:
        producer.flush()
    metas = [f.result() for f in futures]

    assert server.injected["drop"] > 0 and server.injected["503"] > 0
    assert any(m.duplicate for m in metas), "a lost answer's retry must come back duplicate"
    isolation = "read_committed" if transactional else "read_uncommitted"
    records = read_topic(cluster.url, topic, 3, expect=sent, isolation_level=isolation)
    _check_exactly_once_in_order(records, sent, keys)


@pytest.mark.parametrize("version", [1, 2])
def test_lost_answers_of_coordinator_calls_are_retried(
    twin: Twin, cluster: Cluster, version: int
) -> None:
    """AddPartitions, AddOffsets and EndTxn are idempotent: a retry after a lost answer is
    answered as the first attempt was (under transaction version 2 there is no
    AddPartitions, and the retried EndTxn answers the same bumped epoch)."""
    topic = cluster.create_topic(partitions=1)
    dropped: set[str] = set()

    def plan(request: httpx.Request) -> str | None:
        action = request.url.path.rsplit("/", 1)[-1]
        is_txn = "/v1/transactions/" in request.url.path
        if is_txn and action in {"partitions", "commit"} and action not in dropped:
            dropped.add(action)
            return "drop"
        return None

    server = twin.faulty(plan)
    producer = twin.transactional_producer(
        cluster.url, uid("tx"), retry=FAST, transport=server.transport(twin.kind),
        transaction_version=version,
    )
    producer.init_transactions()
    epoch = producer.producer_epoch
    with producer.transaction():
        producer.send(topic, "once")
    assert server.injected["drop"] == (2 if version == 1 else 1)
    assert producer.producer_epoch == (epoch if version == 1 else epoch + 1)
    with producer.transaction():
        producer.send(topic, "twice")
    assert [r.value for r in read_topic(cluster.url, topic, 1, expect=2)] == ["once", "twice"]


@pytest.mark.parametrize("version", [1, 2])
def test_unknown_producer_id_aborts_then_bumps_the_epoch(
    twin: Twin, cluster: Cluster, version: int
) -> None:
    """KIP-360: a sequence error makes the transaction abortable; the abort is followed by
    an init that bumps the epoch and keeps the producer id, and the producer goes on.
    Under transaction version 2 every end bumps the epoch already: no init follows."""
    topic = cluster.create_topic(partitions=1)
    armed = {"on": False}

    def plan(request: httpx.Request) -> str | None:
        if armed["on"] and is_produce(request):
            armed["on"] = False
            return "UNKNOWN_PRODUCER_ID"
        return None

    server = twin.faulty(plan)
    producer = twin.transactional_producer(
        cluster.url, uid("tx"), retry=FAST, transport=server.transport(twin.kind),
        transaction_version=version,
    )
    producer.init_transactions()
    with producer.transaction():
        producer.send(topic, "first")
    pid, epoch = producer.producer_id, producer.producer_epoch

    armed["on"] = True
    producer.begin_transaction()
    failed = producer.send(topic, "doomed")
    assert isinstance(failed.exception(), UnknownProducerIdError)
    assert producer.state is ProducerState.ABORTABLE_ERROR
    with pytest.raises(UnknownProducerIdError):
        producer.commit_transaction()
    producer.abort_transaction()
    assert producer.state is ProducerState.READY  # type: ignore[comparison-overlap]
    assert (producer.producer_id, producer.producer_epoch) == (pid, epoch + 1)

    with producer.transaction():
        producer.send(topic, "second")
    records = read_topic(cluster.url, topic, 1, expect=2)
    assert [r.value for r in records] == ["first", "second"]


def test_idempotent_producer_takes_a_new_id_after_a_sequence_error(
    twin: Twin, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=1)
    armed = {"on": False}

    def plan(request: httpx.Request) -> str | None:
        if armed["on"] and is_produce(request):
            armed["on"] = False
            return "OUT_OF_ORDER_SEQUENCE_NUMBER"
        return None

    server = twin.faulty(plan)
    producer = twin.producer(cluster.url, retry=FAST, transport=server.transport(twin.kind))
    producer.send(topic, "a").result()
    first_pid = producer.producer_id
    armed["on"] = True
    failed = producer.send(topic, "b")
    assert isinstance(failed.exception(), OutOfOrderSequenceNumberError)
    producer.send(topic, "c").result()
    assert producer.producer_id != first_pid
    records = read_topic(cluster.url, topic, 1, expect=2, isolation_level="read_uncommitted")
    assert [r.value for r in records] == ["a", "c"]


def test_requests_that_are_not_idempotent_are_not_retried(cluster: Cluster) -> None:
    server = FaultyServer(lambda r: "drop" if r.url.path == "/v1/topics" else None)
    name = uid("topic")
    with AdminClient(cluster.url, retry=FAST, transport=server.transport("sync")) as admin:
        with pytest.raises(NetworkError):
            admin.create_topic(name, 1)
        assert server.requests["POST /v1/topics"] == 1
        # the create did apply; exist_ok turns the second attempt into a describe
        server.plan = lambda r: None
        assert admin.create_topic(name, 1, exist_ok=True).name == name
    server.close_sync()
