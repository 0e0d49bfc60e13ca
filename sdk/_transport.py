"""The transport seam: HTTP requests, the error envelope -> exception mapping, and retries
by the policy table of ``sdk._retry_policy``.

``classify`` reads a request's row of ``POLICIES``; the sync and async transports retry
with tenacity from it (the names are re-exported here, where the SDK's callers import them).

Both transports take an httpx transport (``httpx.MockTransport``, ``httpx.ASGITransport``,
or a wrapper that injects faults); that is the only seam tests need.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
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
from sdk._retry_policy import (
    POLICIES,
    UNKNOWN_OUTCOME,
    Req,
    RetryPolicy,
    UnavailableResponse,
    Verdict,
    backoff_s,
    classify,
)
from sdk._tls import tls_context

if TYPE_CHECKING:
    from sdk._metadata import MetadataCache


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


class _WireWatch:
    """A produce request's ``trace`` extension: calls ``on_wire`` once the body has been
    written to the connection, and lets go of it when the request is over (``release``).

    httpx keeps every response in a reference cycle with its stream, so a request and its
    extensions outlive the call until the garbage collector frees the cycle, and a
    request that was in flight across two collections waits for the oldest generation's.
    A closure there kept the request's batches, with every record and future of them,
    alive that long: at 60,000 records a second the collector walked hundreds of
    thousands of them, about a third of a producer's CPU."""

    __slots__ = ("on_wire",)

    def __init__(self, on_wire: Callable[[], None]) -> None:
        self.on_wire: Callable[[], None] | None = on_wire

    def __call__(self, event: str, _info: dict[str, Any]) -> None:
        if event == _BODY_SENT and self.on_wire is not None:
            self.on_wire()

    def release(self) -> None:
        self.on_wire = None


class _AsyncWireWatch(_WireWatch):
    """``_WireWatch`` for httpx's async transport, which awaits its trace callback."""

    __slots__ = ()

    async def __call__(self, event: str, _info: dict[str, Any]) -> None:  # type: ignore[override]
        if event == _BODY_SENT and self.on_wire is not None:
            self.on_wire()


def _body(json: Any) -> bytes | None:
    return None if json is None else orjson.dumps(json)


def _request_options(
    json: Any, params: dict[str, Any] | None, watch: _WireWatch | None, timeout_s: float | None
) -> dict[str, Any]:
    """The keyword arguments of one attempt's ``request``, sync or async alike."""
    return {
        "content": _body(json), "params": params,
        "extensions": None if watch is None else {"trace": watch},
        "timeout": httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
    }  # fmt: skip


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
        watch = None if on_wire is None else _WireWatch(on_wire)
        try:
            response = self.client.request(method, url, **_request_options(json, params, watch,
                                                                           timeout_s))  # fmt: skip
        finally:
            if watch is not None:
                watch.release()
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
        watch = None if on_wire is None else _AsyncWireWatch(on_wire)
        try:
            response = await self.client.request(
                method, url, **_request_options(json, params, watch, timeout_s)
            )
        finally:
            if watch is not None:
                watch.release()
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
