"""The transport seam with ``httpx.MockTransport``: envelopes become exceptions once, and
each request is retried exactly as its row of ``POLICIES`` says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from eos_protocol.errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    InternalError,
    KafkaStorageError,
    LeaderNotAvailableError,
    UnstableOffsetCommitError,
)
from sdk import (
    EosTimeoutError,
    InvalidTxnStateError,
    NetworkError,
    NotCoordinatorError,
    ProducerFencedError,
    RetryConfig,
)
from sdk._retry_policy import FAST_ATTEMPTS, backoff_s
from sdk._transport import (
    POLICIES,
    AsyncTransport,
    Req,
    SyncTransport,
    UnavailableResponse,
    Verdict,
    classify,
    parse_response,
)

pytestmark = pytest.mark.unit

FAST = RetryConfig(backoff_ms=1, backoff_max_ms=2, fast_backoff_ms=1, request_timeout_ms=1000)


def envelope(code: str, status: int, **details: object) -> httpx.Response:
    body: dict[str, object] = {"code": code, "message": "m", "retriable": status == 503}
    if details:
        body["details"] = details
    return httpx.Response(status, json={"error": body})


def test_envelopes_become_their_exception_classes() -> None:
    with pytest.raises(ProducerFencedError, match="PRODUCER_FENCED"):
        parse_response(envelope("PRODUCER_FENCED", 409))
    with pytest.raises(InternalError):
        parse_response(httpx.Response(500, text="oops"))
    with pytest.raises(UnavailableResponse):
        parse_response(httpx.Response(502, text="bad gateway"))
    assert parse_response(httpx.Response(200, json={"a": 1})) == {"a": 1}


@pytest.mark.parametrize(
    ("req", "exc", "verdict"),
    [
        (Req.END_TXN, NotCoordinatorError(), Verdict.REFIND),
        (Req.INIT_TRANSACTIONS, CoordinatorNotAvailableError(), Verdict.REFIND),
        (Req.ADD_PARTITIONS, ConcurrentTransactionsError(), Verdict.RETRY),
        (Req.OFFSET_FETCH, UnstableOffsetCommitError(), Verdict.RETRY),
        (Req.END_TXN, InvalidTxnStateError(), Verdict.FAIL),
        (Req.PRODUCE, httpx.ReadError("lost"), Verdict.RETRY),
        (Req.PRODUCE, KafkaStorageError(), Verdict.RETRY),
        (Req.CREATE_TOPIC, httpx.ReadError("lost"), Verdict.FAIL),
        (Req.CREATE_TOPIC, UnavailableResponse(), Verdict.FAIL),
    ],
)
def test_the_policy_table(req: Req, exc: BaseException, verdict: Verdict) -> None:
    assert classify(POLICIES[req], exc) is verdict


def test_every_request_kind_has_a_policy() -> None:
    assert set(POLICIES) == set(Req)


Handler = Callable[[httpx.Request], httpx.Response]


def scripted(*answers: httpx.Response | Exception) -> tuple[Handler, list[str]]:
    seen: list[str] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handler, seen


def call_both(
    kind: str, handler: Handler, req: Req, base: str = "http://a", timeout_s: float = 2
) -> object:
    """The same call through the blocking and the async transport."""
    target = {"url": base}

    def invalidate(exc: BaseException) -> None:
        url = getattr(exc, "details", {}).get("coordinator_url")
        target["url"] = url or "http://found-again"

    if kind == "sync":
        transport = SyncTransport(FAST, transport=httpx.MockTransport(handler))
        try:
            return transport.call(req, "POST", "/x", base=lambda: target["url"], json={},
                                  timeout_s=timeout_s, invalidate=invalidate)
        finally:
            transport.close()

    async def run() -> object:
        async def base_url() -> str:
            return target["url"]

        async def ahandler(request: httpx.Request) -> httpx.Response:
            return handler(request)

        transport = AsyncTransport(FAST, transport=httpx.MockTransport(ahandler))
        try:
            return await transport.call(req, "POST", "/x", base=base_url, json={},
                                        timeout_s=timeout_s, invalidate=invalidate)
        finally:
            await transport.aclose()

    return asyncio.run(run())


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_not_coordinator_moves_to_the_named_owner(kind: str) -> None:
    handler, seen = scripted(
        envelope("NOT_COORDINATOR", 503, coordinator_url="http://owner"),
        httpx.Response(200, json={"ok": True}),
    )
    assert call_both(kind, handler, Req.END_TXN) == {"ok": True}
    assert seen == ["http://a/x", "http://owner/x"]


def test_coordinator_not_available_finds_the_coordinator_again(kind: str) -> None:
    handler, seen = scripted(
        envelope("COORDINATOR_NOT_AVAILABLE", 503), httpx.Response(200, json={})
    )
    call_both(kind, handler, Req.ADD_OFFSETS)
    assert seen == ["http://a/x", "http://found-again/x"]


def test_concurrent_transactions_and_lost_answers_are_retried_in_place(kind: str) -> None:
    handler, seen = scripted(
        envelope("CONCURRENT_TRANSACTIONS", 503),
        httpx.ReadTimeout("slow"),
        httpx.Response(503, text="proxy"),
        httpx.Response(200, json={"done": 1}),
    )
    assert call_both(kind, handler, Req.ADD_PARTITIONS) == {"done": 1}
    assert len(seen) == 4


def test_fatal_errors_are_not_retried(kind: str) -> None:
    handler, seen = scripted(envelope("PRODUCER_FENCED", 409))
    with pytest.raises(ProducerFencedError):
        call_both(kind, handler, Req.END_TXN)
    assert len(seen) == 1


def test_lost_answer_of_a_request_that_is_not_idempotent(kind: str) -> None:
    handler, seen = scripted(httpx.ReadError("lost"))
    with pytest.raises(NetworkError):
        call_both(kind, handler, Req.CREATE_TOPIC)
    assert len(seen) == 1


def test_retries_stop_at_the_deadline(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("down", request=request)

    with pytest.raises(EosTimeoutError):
        call_both(kind, handler, Req.METADATA, timeout_s=0.3)


def test_a_stale_topic_keeps_its_partition_count() -> None:
    """A failed produce in one thread marks the leaders stale while a send in another
    thread is choosing a partition: the count must stay known."""
    from sdk._metadata import MetadataCache
    from sdk._types import TopicPartition

    cache = MetadataCache("http://c/")
    info = {"name": "t", "partitions": [
        {"partition": 1, "leader": {"node_id": 2, "url": "http://n2/"}},
        {"partition": 0, "leader": {"node_id": 1, "url": "http://n1"}},
    ]}
    assert cache.update_topic(info) == ["http://n1", "http://n2"]
    cache.invalidate_topic("t")
    assert cache.partition_count("t") == 2
    assert cache.leader(TopicPartition("t", 0)) is None  # looked up again before use
    cache.update_topic(info)
    assert cache.leader(TopicPartition("t", 1)) == "http://n2"

    # A partition with no live leader (an election under way) shows an empty URL: the
    # lookup says LEADER_NOT_AVAILABLE, retriable, and asks the coordinator again next time.
    leaderless = {"name": "t", "partitions": [
        {"partition": 0, "leader": {"node_id": -1, "url": ""}},
        {"partition": 1, "leader": {"node_id": 2, "url": "http://n2"}},
    ]}  # fmt: skip
    cache.update_topic(leaderless)
    with pytest.raises(LeaderNotAvailableError):
        cache.leader(TopicPartition("t", 0))
    assert cache.leader(TopicPartition("t", 1)) is None, "the topic is looked up again"


def test_concurrent_transactions_is_retried_fast_then_backs_off_like_any_error() -> None:
    """A previous transaction that stays undecided must not draw two hundred requests a
    second from each waiting client: the short backoff is for the first attempts only."""
    retry = RetryConfig(backoff_ms=100, backoff_max_ms=1_000, fast_backoff_ms=5)
    busy = ConcurrentTransactionsError("the previous transaction is completing")
    waits = [backoff_s(busy, attempt, retry) for attempt in range(1, FAST_ATTEMPTS + 8)]
    assert waits[:FAST_ATTEMPTS] == [0.005] * FAST_ATTEMPTS
    grown = waits[FAST_ATTEMPTS:]
    assert 0.08 <= grown[0] <= 0.12, grown
    assert all(0.8 <= wait <= 1.2 for wait in grown[-3:]), grown  # capped at backoff_max_ms
    # other errors keep their own schedule from the first attempt
    assert 0.08 <= backoff_s(NotCoordinatorError("moved"), 5, retry) <= 0.12
