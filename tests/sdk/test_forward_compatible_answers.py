"""Answers may grow: a field this version does not know, at any depth of any answer, changes
nothing for the SDK; requests still refuse unknown fields.

The services of a cluster are upgraded one at a time while clients keep running, so a newer
service answering with one more field (``replication_factor`` in ``TopicInfo``, say) must
not break a deployed client. The test runs the clients against a real cluster through an
httpx transport that adds an unknown field to every JSON object of every answer — the
envelope, every model, every nested model and list element — and checks each call still
gives the same result as without it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import sdk
from eos_protocol.common import AnswerModel, TopicPartition, WireModel, read_answer
from eos_protocol.coordinator import CreateTopicRequest, TopicInfo
from eos_protocol.errors import TransactionalIdNotFoundError
from eos_protocol.states import TransactionState
from tests.sdk.cluster import Cluster
from tests.sdk.helpers import uid, wait_for

FUTURE_FIELD = "added_by_a_newer_version"


def with_future_fields(value: Any) -> Any:
    """``value`` with an unknown field added to every JSON object in it, at every depth."""
    if isinstance(value, dict):
        grown = {key: with_future_fields(item) for key, item in value.items()}
        grown[FUTURE_FIELD] = {"nested": [1, 2], "note": "ignore me"}
        return grown
    if isinstance(value, list):
        return [with_future_fields(item) for item in value]
    return value


def _grown(response: httpx.Response, content: bytes) -> httpx.Response:
    if not response.headers.get("content-type", "").startswith("application/json"):
        return httpx.Response(response.status_code, headers=response.headers, content=content)
    body = json.dumps(with_future_fields(json.loads(content))).encode()
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return httpx.Response(response.status_code, headers=headers, content=body)


class GrowingTransport(httpx.HTTPTransport):
    """A real HTTP transport whose every JSON answer comes back with unknown fields."""

    def __init__(self) -> None:
        super().__init__()
        self.answers = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        content = response.read()
        self.answers += 1
        return _grown(response, content)


class AsyncGrowingTransport(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.answers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        content = await response.aread()
        self.answers += 1
        return _grown(response, content)


@pytest.mark.unit
def test_requests_still_refuse_unknown_fields() -> None:
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        CreateTopicRequest.model_validate({"name": "orders", "partitions": 1, "typo": 1})
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TopicPartition.model_validate({"topic": "orders", "partition": 0, "typo": 1})


@pytest.mark.unit
def test_answer_models_ignore_unknown_fields_at_every_depth() -> None:
    body = {
        "name": "orders",
        "partitions": [{"partition": 0, "leader": {"node_id": 1, "url": "http://n1:8091"}}],
    }
    plain = read_answer(TopicInfo, body)
    assert read_answer(TopicInfo, with_future_fields(body)) == plain
    # a model answers share with requests is read leniently only through read_answer
    assert read_answer(TopicPartition, {"topic": "t", "partition": 1, FUTURE_FIELD: 0}) == (
        TopicPartition(topic="t", partition=1)
    )


@pytest.mark.unit
def test_every_model_is_classified() -> None:
    """Each wire model either refuses unknown fields (requests) or ignores them (answers)."""
    import eos_protocol.acl
    import eos_protocol.coordinator
    import eos_protocol.node

    models = [
        value
        for module in (eos_protocol.acl, eos_protocol.coordinator, eos_protocol.node)
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, WireModel)
    ]
    assert len(models) > 30
    for model in models:
        expected = "ignore" if issubclass(model, AnswerModel) else "forbid"
        assert model.model_config.get("extra") == expected, model.__name__


def test_blocking_clients_read_grown_answers(cluster: Cluster) -> None:
    transport = GrowingTransport()
    topic = uid("grown")
    with sdk.AdminClient(cluster.url, transport=transport) as admin:
        info = admin.create_topic(topic, 2)
        assert [p.partition for p in info.partitions] == [0, 1]
        assert admin.describe_topic(topic) == info
        described = admin.describe_cluster()
        assert {n.url for n in described.nodes} == {n.url for n in cluster.nodes}
        assert admin.find_coordinator("g", "group").url in {n.url for n in cluster.nodes}

        tid = uid("grown-txn")
        producer = sdk.TransactionalProducer(cluster.url, tid, transport=transport)
        try:
            producer.init_transactions()
            with producer.transaction():
                sent = producer.send(topic, "committed", key="k").result()
                producer.send_offsets_to_transaction({(topic, 0): 7}, uid("group"))
            assert sent.topic == topic and sent.offset >= 0
            producer.begin_transaction()
            producer.send(topic, "aborted", key="k").result()
            holders = admin.describe_producers((topic, sent.partition))
            assert any(p.producer_id == producer.producer_id for p in holders)
            assert admin.describe_transaction(tid).state is TransactionState.ONGOING
            assert tid in {t.transactional_id for t in admin.list_transactions()}
            producer.abort_transaction()
        finally:
            producer.close()
        wait_for(lambda: admin.describe_transaction(tid).state is TransactionState.COMPLETE_ABORT,
                 what="the abort to complete")
        with pytest.raises(TransactionalIdNotFoundError):  # error envelopes grow too
            admin.describe_transaction(uid("unknown"))

        offsets = admin.list_offsets((topic, sent.partition))
        assert offsets.last_stable_offset == offsets.high_watermark

    idempotent = sdk.Producer(cluster.url, transport=transport)
    try:
        idempotent.send(topic, "plain", key="k").result()
    finally:
        idempotent.close()

    group = uid("readers")
    with sdk.Consumer(cluster.url, group, transport=transport) as consumer:
        consumer.assign([(topic, sent.partition)])
        values: list[Any] = []
        wait_for(lambda: values.extend(r.value for r in consumer.poll(timeout=0.5))
                 or values == ["committed", "plain"], what="the committed records")
        consumer.commit()
        [committed] = consumer.committed([(topic, sent.partition)]).values()
        assert committed is not None
        assert committed.offset == consumer.position((topic, sent.partition))
    assert transport.answers > 10


def test_async_clients_read_grown_answers(cluster: Cluster) -> None:
    async def scenario() -> list[Any]:
        transport = AsyncGrowingTransport()
        topic = uid("grown-async")
        async with sdk.AsyncAdminClient(cluster.url, transport=transport) as admin:
            await admin.create_topic(topic, 1)
            assert (await admin.describe_topic(topic)).name == topic
        producer = sdk.AsyncTransactionalProducer(cluster.url, uid("grown"), transport=transport)
        try:
            await producer.init_transactions()
            producer.begin_transaction()
            await (await producer.send(topic, "one"))
            await producer.commit_transaction()
        finally:
            await producer.close()
        values: list[Any] = []
        async with sdk.AsyncConsumer(cluster.url, transport=transport) as consumer:
            consumer.assign([(topic, 0)])
            for _ in range(40):
                values.extend(r.value for r in await consumer.poll(timeout=0.5))
                if values:
                    break
        assert transport.answers > 5
        return values

    assert asyncio.run(scenario()) == ["one"]
