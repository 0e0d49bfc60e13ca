"""The transport seam: HTTP requests, the error envelope -> exception mapping, and the
retry rule of every request, in one table.

Every request the SDK makes has a row in ``POLICIES``: whether it is idempotent (so a
network error or timeout, after which the server may or may not have applied it, can be
retried), which retriable codes it retries, and which of them mean "find the coordinator
again". ``classify`` reads that row; the sync and async transports retry with tenacity
from it, and the producer's sender uses the same verdicts for produce requests, which it
reschedules itself so that the order of a partition's batches survives retries.

Both transports take an httpx transport (``httpx.MockTransport``, ``httpx.ASGITransport``,
or a wrapper that injects faults); that is the only seam tests need.
"""

from __future__ import annotations

import enum
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_never,
)
from tenacity.stop import stop_base

from eos_protocol.errors import (
    EosError,
    InternalError,
    error_for,
)
from eos_protocol.parsing import collector_paused
from sdk._config import RetryConfig
from sdk._errors import EosTimeoutError, NetworkError
from sdk._tls import tls_context

if TYPE_CHECKING:
    from sdk._metadata import MetadataCache


class Req(enum.StrEnum):
    """Every kind of request the SDK sends."""

    METADATA = "metadata"
    TOPIC = "topic"
    CREATE_TOPIC = "create_topic"
    ALTER_TOPIC = "alter_topic"
    FIND_COORDINATOR = "find_coordinator"
    INIT_PRODUCER_ID = "init_producer_id"
    INIT_TRANSACTIONS = "init_transactions"
    ADD_PARTITIONS = "add_partitions"
    ADD_OFFSETS = "add_offsets"
    END_TXN = "end_txn"
    PRODUCE = "produce"
    FETCH = "fetch"
    LIST_OFFSETS = "list_offsets"
    OFFSET_COMMIT = "offset_commit"
    TXN_OFFSET_COMMIT = "txn_offset_commit"
    OFFSET_FETCH = "offset_fetch"
    GROUP_HEARTBEAT = "group_heartbeat"
    LIST_TRANSACTIONS = "list_transactions"
    DESCRIBE_TRANSACTION = "describe_transaction"
    DESCRIBE_PRODUCERS = "describe_producers"
    FORCE_ABORT = "force_abort"
    LIST_ACLS = "list_acls"
    CREATE_ACLS = "create_acls"
    DELETE_ACLS = "delete_acls"
    LIST_GROUPS = "list_groups"
    DESCRIBE_GROUP = "describe_group"
    DELETE_GROUP = "delete_group"
    RESET_GROUP_OFFSETS = "reset_group_offsets"


class Verdict(enum.Enum):
    RETRY = "retry"  # send the same request again after a backoff
    REFIND = "refind"  # find the coordinator (or leader) again, then retry
    FAIL = "fail"  # give the error to the caller


_ROUTING = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"})
_ALL_RETRIABLE = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
     "CONCURRENT_TRANSACTIONS", "NOT_LEADER_OR_FOLLOWER", "UNSTABLE_OFFSET_COMMIT",
     "KAFKA_STORAGE_ERROR"}
)  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """The retry rule of one kind of request.

    ``idempotent``: sending it twice has the effect of sending it once, so an unknown
    outcome (connection lost, timeout, a bare 502/503/504) may be retried. ``retriable``:
    the error codes worth another attempt. ``refind``: codes after which the target is
    looked up again. ``in_place``: the transport retries it; if false the caller does.
    ``coordinator``: it is answered at once (by a coordinator, or a node's offsets
    calls), so one attempt may take only ``coordinator_timeout_ms`` (otherwise
    ``request_timeout_ms``).
    """

    idempotent: bool
    retriable: frozenset[str] = _ALL_RETRIABLE
    refind: frozenset[str] = _ROUTING
    in_place: bool = True
    coordinator: bool = True


# Kafka's metadata errors: the partition is not (yet, or no longer) where the client
# thought, because it was just created, its node is restarting or its leader moved. The
# client looks the leader up again and retries until its deadline.
_METADATA_STALE = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    }
)
# acks=all could not be met now; the same request (the same sequence) is tried again.
_REPLICATION = frozenset({"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"})
_NODE_REFIND = _METADATA_STALE | {"NOT_COORDINATOR"}
_NODE_RETRIABLE = _ALL_RETRIABLE | _METADATA_STALE | _REPLICATION


def _node(refind: frozenset[str] = _NODE_REFIND, *, quick: bool = False) -> RetryPolicy:
    """A request to a storage node: attempts may take the full request timeout, or only
    ``coordinator_timeout_ms`` when ``quick`` (a node answers offsets calls at once; one
    left unanswered that long is at a paused or cut-off leader, and is better sent again
    to whichever leader the cluster has by then than waited for)."""
    return RetryPolicy(
        idempotent=True, retriable=_NODE_RETRIABLE, refind=refind, coordinator=quick
    )


#: The one place where the retry rule of each request lives.
POLICIES: dict[Req, RetryPolicy] = {
    Req.METADATA: RetryPolicy(idempotent=True),
    Req.TOPIC: RetryPolicy(idempotent=True),
    # A second create after a lost answer would say TOPIC_ALREADY_EXISTS: not idempotent.
    # It waits for the partitions to be created on their nodes: the longer timeout.
    Req.CREATE_TOPIC: RetryPolicy(idempotent=False, coordinator=False),
    Req.ALTER_TOPIC: RetryPolicy(idempotent=True),  # a repeat sets the same values
    Req.FIND_COORDINATOR: RetryPolicy(idempotent=True),
    # A lost answer only wastes a producer id.
    Req.INIT_PRODUCER_ID: RetryPolicy(idempotent=True),
    # A repeated init bumps the epoch once more; the client keeps whatever it gets last.
    Req.INIT_TRANSACTIONS: RetryPolicy(idempotent=True),
    Req.ADD_PARTITIONS: RetryPolicy(idempotent=True),
    Req.ADD_OFFSETS: RetryPolicy(idempotent=True),
    # The coordinator answers success to a repeat of the decision it already took.
    Req.END_TXN: RetryPolicy(idempotent=True),
    # Sequence numbers make a repeat a duplicate; the accumulator keeps the order.
    Req.PRODUCE: RetryPolicy(
        idempotent=True,
        retriable=_METADATA_STALE
        | _REPLICATION
        | {
            "KAFKA_STORAGE_ERROR",
            "COORDINATOR_NOT_AVAILABLE",
            "CONCURRENT_TRANSACTIONS",
            "COORDINATOR_LOAD_IN_PROGRESS",
        },
        refind=_METADATA_STALE,
        in_place=False,
        coordinator=False,
    ),
    Req.FETCH: _node(),
    Req.LIST_OFFSETS: _node(quick=True),
    Req.OFFSET_COMMIT: _node(quick=True),
    Req.TXN_OFFSET_COMMIT: _node(_NODE_REFIND | _ROUTING, quick=True),
    Req.OFFSET_FETCH: _node(quick=True),
    # A repeated heartbeat reports the same epoch and partitions; a repeated join names
    # the same client-made member id.
    Req.GROUP_HEARTBEAT: RetryPolicy(idempotent=True),
    Req.LIST_TRANSACTIONS: RetryPolicy(idempotent=True),
    Req.DESCRIBE_TRANSACTION: RetryPolicy(idempotent=True),
    Req.DESCRIBE_PRODUCERS: _node(),
    Req.FORCE_ABORT: RetryPolicy(idempotent=True),
    Req.LIST_ACLS: RetryPolicy(idempotent=True),
    # Creating a binding that exists is harmless, and so is deleting one that is gone
    # (though a repeat's answer then lists fewer deleted bindings).
    Req.CREATE_ACLS: RetryPolicy(idempotent=True),
    Req.DELETE_ACLS: RetryPolicy(idempotent=True),
    # Group administration. Listing reads the database of any instance; describing asks
    # the storage nodes for each partition's lag too: the longer timeout.
    Req.LIST_GROUPS: RetryPolicy(idempotent=True),
    Req.DESCRIBE_GROUP: RetryPolicy(idempotent=True, coordinator=False),
    # A delete repeated after a lost answer finds the group gone (GROUP_ID_NOT_FOUND):
    # the state asked for, which the admin client takes as done when an earlier attempt
    # may have reached the coordinator.
    Req.DELETE_GROUP: RetryPolicy(idempotent=True),
    # A repeated reset computes its target again: the same offsets for to_offset, and for
    # earliest, latest or a time what a fresh reset would set now. The group's lock orders
    # a retry behind a slow first attempt; it reads each partition's bounds on the nodes.
    Req.RESET_GROUP_OFFSETS: RetryPolicy(idempotent=True, coordinator=False),
}


class UnavailableResponse(Exception):
    """A 502/503/504 without the error envelope (a proxy or a dying server): the request
    may or may not have been applied, exactly like a lost connection."""


#: Failures after which the outcome of a request is unknown.
UNKNOWN_OUTCOME = (httpx.TransportError, UnavailableResponse)


def classify(policy: RetryPolicy, exc: BaseException) -> Verdict:
    """What to do after ``exc``, by the policy's row.

    The row decides, not the error's class: UNKNOWN_TOPIC_OR_PARTITION is no retriable
    error in the catalogue (a node cannot know whether the partition will come), but a
    request to a storage node treats it as stale metadata and retries, as Kafka does.
    """
    if isinstance(exc, UNKNOWN_OUTCOME):
        return Verdict.RETRY if policy.idempotent else Verdict.FAIL
    if isinstance(exc, EosError) and exc.code in policy.retriable:
        return Verdict.REFIND if exc.code in policy.refind else Verdict.RETRY
    return Verdict.FAIL


#: Answers after which the next attempt is worth making soon, whatever came before:
#: the owner moved (and said where), or it is loading and will serve in a moment.
_SOON = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"})


def backoff_s(exc: BaseException | None, attempt: int, retry: RetryConfig) -> float:
    """Exponential backoff with jitter; CONCURRENT_TRANSACTIONS gets the short one.

    No growth after a timed-out attempt (the attempt itself was the wait, and the next
    one likely goes to another instance) or after an answer that says the next attempt
    will do (``_SOON``): growing there only delays the first commit after a failover.
    """
    if isinstance(exc, EosError) and exc.code == "CONCURRENT_TRANSACTIONS":
        return retry.fast_backoff_ms / 1000
    if isinstance(exc, httpx.TimeoutException) or (
        isinstance(exc, EosError) and exc.code in _SOON
    ):
        attempt = 1
    base = min(retry.backoff_max_ms, retry.backoff_ms * 2 ** max(0, attempt - 1))
    return float(base * random.uniform(0.8, 1.2) / 1000)


#: Answers at least this large are parsed with the collector paused.
LARGE_ANSWER_BYTES = 64 * 1024


def error_from_body(error: dict[str, Any]) -> EosError:
    """The exception an envelope's error body names: a whole answer's, or one entry's of
    an answer that carries an error per partition (``/v1/produce``, ``/v1/fetch``)."""
    details = error.get("details")
    return error_for(
        str(error["code"]),
        str(error.get("message", "")),
        details if isinstance(details, dict) else None,
    )


def parse_response(response: httpx.Response) -> Any:
    """The JSON body of a success, or the exception its error envelope names."""
    if response.status_code < 300:
        content = response.content
        if len(content) >= LARGE_ANSWER_BYTES:
            with collector_paused():
                return orjson.loads(content)
        return orjson.loads(content) if content else {}
    try:
        exc = error_from_body(orjson.loads(response.content)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        if response.status_code in (502, 503, 504):
            raise UnavailableResponse(f"HTTP {response.status_code} without an envelope") from None
        raise InternalError(
            f"HTTP {response.status_code} without an error envelope: {response.text[:200]}"
        ) from None
    raise exc


def _final_error(req: Req, policy: RetryPolicy, exc: BaseException) -> BaseException:
    """Network failures leave as SDK errors: a timeout if retrying was allowed (the caller
    may call again), NetworkError if the request was not safe to repeat."""
    if isinstance(exc, UNKNOWN_OUTCOME):
        if policy.idempotent:
            return EosTimeoutError(f"{req.value}: no answer before the deadline ({exc!r})")
        return NetworkError(f"{req.value}: {exc!r}; the request may or may not have applied")
    return exc


def refind_target(exc: BaseException) -> str | None:
    """The owner's URL a NOT_COORDINATOR names, when it names one."""
    if isinstance(exc, EosError):
        url = exc.details.get("coordinator_url")
        if isinstance(url, str) and url:
            return url.rstrip("/")
    return None


Invalidate = Callable[[BaseException], None]


class _RetryShape:
    """The tenacity arguments a policy implies, shared by both transports."""

    def __init__(
        self, req: Req, retry: RetryConfig, timeout_s: float | None, invalidate: Invalidate | None
    ) -> None:
        self.req = req
        self.policy = POLICIES[req]
        self.retry = retry
        self.stop: stop_base = stop_never if timeout_s is None else stop_after_delay(timeout_s)
        self.invalidate = invalidate

    def should_retry(self, exc: BaseException) -> bool:
        return self.policy.in_place and classify(self.policy, exc) is not Verdict.FAIL

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return backoff_s(exc, state.attempt_number, self.retry)

    def before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is None or self.invalidate is None:
            return
        if classify(self.policy, exc) is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME):
            self.invalidate(exc)

    def kwargs(self) -> dict[str, Any]:
        return {
            "stop": self.stop,
            "wait": self.wait,
            "retry": retry_if_exception(self.should_retry),
            "before_sleep": self.before_sleep,
            "reraise": True,
        }


TOKEN_ENV = "EOS_TOKEN"
CA_FILE_ENV = "EOS_CA_FILE"


def _client_kwargs(
    retry: RetryConfig, headers: dict[str, str], token: str | None, ca_file: str | None
) -> dict[str, Any]:
    """The httpx client's settings. The token and CA bundle default to ``EOS_TOKEN`` and
    ``EOS_CA_FILE``, so a job gets its credentials from its environment, not its code."""
    token = token or os.environ.get(TOKEN_ENV) or None
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    auth = {"authorization": f"Bearer {token}"} if token else {}
    return {
        "timeout": retry.request_timeout_ms / 1000,
        "headers": {"content-type": "application/json", **auth, **headers},
        "limits": httpx.Limits(max_connections=200, max_keepalive_connections=100),
        "verify": tls_context(ca_file),
    }


_BODY_SENT = "http11.send_request_body.complete"


def _sync_trace(on_wire: Callable[[], None]) -> Callable[[str, dict[str, Any]], None]:
    def trace(event: str, _info: dict[str, Any]) -> None:
        if event == _BODY_SENT:
            on_wire()

    return trace


def _async_trace(
    on_wire: Callable[[], None],
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    async def trace(event: str, _info: dict[str, Any]) -> None:
        if event == _BODY_SENT:
            on_wire()

    return trace


def _body(json: Any) -> bytes | None:
    return None if json is None else orjson.dumps(json)


def attempt_timeout_s(policy: RetryPolicy, retry: RetryConfig) -> float:
    """How long one attempt of a request may take."""
    ms = retry.coordinator_timeout_ms if policy.coordinator else retry.request_timeout_ms
    return ms / 1000


#: The small metadata request that names the live coordinators.
MEMBERS_PATH = "/v1/metadata"
MEMBERS_PARAMS = {"include_topics": "false"}


def learn_members(metadata: MetadataCache, body: Any) -> None:
    if isinstance(body, dict):
        metadata.update_metadata(body)


class SyncTransport:
    """Blocking requests through ``httpx.Client``; safe to share between threads.

    ``on_unreachable`` is told the base URL of every attempt that got no answer, so the
    metadata cache can pass over a coordinator that is down or paused."""

    def __init__(
        self,
        retry: RetryConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.retry = retry
        self.on_unreachable: Callable[[str], None] | None = None
        self.client = httpx.Client(
            transport=transport, **_client_kwargs(retry, headers or {}, token, ca_file)
        )

    def send_once(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        on_wire: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One attempt; the envelope becomes an exception. ``on_wire`` is called once the
        request body has been written to the connection."""
        extensions = None if on_wire is None else {"trace": _sync_trace(on_wire)}
        response = self.client.request(
            method, url, content=_body(json), params=params, extensions=extensions,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
        )
        return parse_response(response)

    def _attempt(self, method: str, base: str, path: str, **kwargs: Any) -> Any:
        try:
            return self.send_once(method, base + path, **kwargs)
        except UNKNOWN_OUTCOME:
            if self.on_unreachable is not None:
                self.on_unreachable(base)
            raise

    def bootstrap(self, metadata: MetadataCache) -> str:
        """The coordinator to ask what any instance answers, after learning the live
        instances when that is due (at the first request, then now and then). A failed
        learning call is no error: the configured instances remain."""
        endpoints = metadata.endpoints
        if endpoints.learn_due():
            endpoints.learning_tried()
            base = endpoints.current()
            timeout_s = self.retry.coordinator_timeout_ms / 1000
            try:
                body = self._attempt(
                    "GET", base, MEMBERS_PATH, params=MEMBERS_PARAMS, timeout_s=timeout_s
                )
                learn_members(metadata, body)
            except (EosError, *UNKNOWN_OUTCOME):
                pass
        return endpoints.current()

    def call(
        self,
        req: Req,
        method: str,
        path: str,
        *,
        base: Callable[[], str],
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        invalidate: Invalidate | None = None,
        attempt_s: float | None = None,
    ) -> Any:
        """Send with the retry rule of ``req``; ``base()`` is asked for the target on
        every attempt so a re-found coordinator is used at once. ``json`` may be a
        callable, asked for the body of each attempt. ``attempt_s``: how long one attempt
        may take, when the request's row does not say (a long poll waits longer)."""
        shape = _RetryShape(req, self.retry, timeout_s, invalidate)
        each_s = attempt_timeout_s(shape.policy, self.retry) if attempt_s is None else attempt_s
        try:
            for attempt in Retrying(**shape.kwargs()):
                with attempt:
                    body = json() if callable(json) else json
                    return self._attempt(
                        method, base(), path, json=body, params=params, timeout_s=each_s
                    )
        except BaseException as exc:
            final = _final_error(req, shape.policy, exc)
            if final is exc:
                raise
            raise final from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self.client.close()


class AsyncTransport:
    """The async twin of ``SyncTransport`` on ``httpx.AsyncClient``."""

    def __init__(
        self,
        retry: RetryConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.retry = retry
        self.on_unreachable: Callable[[str], None] | None = None
        self.client = httpx.AsyncClient(
            transport=transport, **_client_kwargs(retry, headers or {}, token, ca_file)
        )

    async def send_once(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        on_wire: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        extensions = None if on_wire is None else {"trace": _async_trace(on_wire)}
        response = await self.client.request(
            method, url, content=_body(json), params=params, extensions=extensions,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
        )
        return parse_response(response)

    async def _attempt(self, method: str, base: str, path: str, **kwargs: Any) -> Any:
        try:
            return await self.send_once(method, base + path, **kwargs)
        except UNKNOWN_OUTCOME:
            if self.on_unreachable is not None:
                self.on_unreachable(base)
            raise

    async def bootstrap(self, metadata: MetadataCache) -> str:
        """As ``SyncTransport.bootstrap``."""
        endpoints = metadata.endpoints
        if endpoints.learn_due():
            endpoints.learning_tried()
            base = endpoints.current()
            timeout_s = self.retry.coordinator_timeout_ms / 1000
            try:
                body = await self._attempt(
                    "GET", base, MEMBERS_PATH, params=MEMBERS_PARAMS, timeout_s=timeout_s
                )
                learn_members(metadata, body)
            except (EosError, *UNKNOWN_OUTCOME):
                pass
        return endpoints.current()

    async def call(
        self,
        req: Req,
        method: str,
        path: str,
        *,
        base: Callable[[], Awaitable[str]],
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        invalidate: Invalidate | None = None,
        attempt_s: float | None = None,
    ) -> Any:
        shape = _RetryShape(req, self.retry, timeout_s, invalidate)
        each_s = attempt_timeout_s(shape.policy, self.retry) if attempt_s is None else attempt_s
        try:
            async for attempt in AsyncRetrying(**shape.kwargs()):
                with attempt:
                    url = await base()
                    body = json() if callable(json) else json
                    return await self._attempt(
                        method, url, path, json=body, params=params, timeout_s=each_s
                    )
        except BaseException as exc:
            final = _final_error(req, shape.policy, exc)
            if final is exc:
                raise
            raise final from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self.client.aclose()


__all__ = [
    "POLICIES",
    "UNKNOWN_OUTCOME",
    "AsyncTransport",
    "Req",
    "RetryPolicy",
    "SyncTransport",
    "UnavailableResponse",
    "Verdict",
    "attempt_timeout_s",
    "backoff_s",
    "classify",
    "parse_response",
    "refind_target",
]
