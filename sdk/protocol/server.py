"""The HTTP boundary of both services: errors into the envelope, internal-token checks.

Every error leaves a service through here, so a client always sees the envelope of
docs/design.md §4, whether the error came from the contract, from schema validation (422), from
an unknown path or from a bug (500, logged with its traceback, never shown).
"""

from __future__ import annotations

import hmac
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sdk.protocol.common import ErrorEnvelope
from sdk.protocol.errors import (
    CATALOGUE,
    EosError,
    InternalError,
    InvalidRequestError,
    MessageTooLargeError,
    NotFoundError,
    UnauthenticatedError,
)

log = logging.getLogger("eos.http")

INTERNAL_TOKEN_HEADER = "Authorization"


def error_response(error: EosError) -> JSONResponse:
    response = JSONResponse(status_code=error.http_status, content=error.envelope())
    if isinstance(error, UnauthenticatedError):
        response.headers["www-authenticate"] = 'Bearer realm="eos"'  # RFC 6750's challenge
    return response


def _envelope(status: int, code: str, message: str, details: Any = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message, "retriable": False}
    if details is not None:
        body["details"] = details
    return JSONResponse(status_code=status, content={"error": body})


def install_error_handlers(app: FastAPI, on_error: Callable[[str], None] | None = None) -> None:
    """Route every failure of ``app`` into the error envelope; ``on_error`` is told the
    code of each contract error answered (for a metric)."""

    async def on_eos_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EosError)
        if on_error is not None:
            on_error(exc.code)
        return error_response(exc)

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        message = f"{'.'.join(first['loc'])}: {first['msg']}"
        return _envelope(422, "INVALID_REQUEST", message, {"problems": problems})

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return error_response(NotFoundError(str(exc.detail)))
        if exc.status_code == 413:
            return error_response(MessageTooLargeError(str(exc.detail)))
        if exc.status_code == 401:
            return error_response(UnauthenticatedError(str(exc.detail)))
        return _envelope(exc.status_code, "INVALID_REQUEST", str(exc.detail))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(InternalError("unexpected server error; see the service log"))

    app.add_exception_handler(EosError, on_eos_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def error_responses(*codes: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for an operation that may answer with these codes.

    Each status gets the error envelope as its schema, the codes it may carry in its
    description and one example per code. Schema validation (422 ``INVALID_REQUEST``) is
    always listed, and so is 400 ``INVALID_REQUEST`` (``RequestShape`` may refuse any
    request before it reaches a route).
    """
    # 400: any request may be refused by ``RequestShape`` (non-UTF-8 escapes, huge headers)
    by_status: dict[int, list[str]] = {400: ["INVALID_REQUEST"], 422: ["INVALID_REQUEST"]}
    for code in codes:
        status = CATALOGUE[code].http_status
        found = by_status.setdefault(status, [])
        if code not in found:
            found.append(code)
    return {
        status: {
            "model": ErrorEnvelope,
            "description": (
                ("Schema validation failed. " if status == 422 else "")
                + "Error envelope; code is one of: "
                + ", ".join(sorted(found))
            ),
            "content": {
                "application/json": {
                    "examples": {
                        code: {
                            "summary": CATALOGUE[code].description,
                            "value": {
                                "error": {
                                    "code": code,
                                    "message": CATALOGUE[code].description,
                                    "retriable": CATALOGUE[code].retriable,
                                }
                            },
                        }
                        for code in sorted(found)
                    }
                }
            },
        }
        for status, found in sorted(by_status.items())
    }


def internal_token_checker(expected: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency that admits only requests bearing the cluster's internal token.

    The comparison takes constant time so a caller cannot learn the token byte by byte.
    With no token configured every internal call is refused.
    """

    async def check(request: Request) -> None:
        if not bears_internal_token(request.headers.get(INTERNAL_TOKEN_HEADER, ""), expected):
            raise UnauthenticatedError("internal endpoint: a valid internal token is required")

    return check


def bears_internal_token(authorization: str, expected: str | None) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <expected>``, compared in
    constant time; never true when no internal token is configured."""
    scheme, _, token = authorization.partition(" ")
    return (
        expected is not None
        and scheme.lower() == "bearer"
        and hmac.compare_digest(token.encode(), expected.encode())
    )


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with MESSAGE_TOO_LARGE.

    A declared ``content-length`` over the limit is refused before anything is read. A body
    without one (chunked) is read here up to the limit and then handed on, so an oversized
    stream is refused with the same 413 instead of failing half-way through parsing.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit():
                declared = int(value)
        if declared is not None:
            if declared > self.limit:
                await self._refuse(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replaying_receive() -> Message:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        await self.app(scope, replaying_receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(MessageTooLargeError(f"request body over {self.limit} bytes"))
        await response(scope, receive, send)


MAX_HEADER_BYTES = 64 * 1024


class RequestShape:
    """ASGI middleware, outermost: refuse requests no route should ever see.

    * A path or query whose percent-escapes are not UTF-8 (``/v1/groups/%FF%FE``): the
      server would decode them with replacement characters, so distinct invalid ids would
      silently name the same group or transactional id.
    * Headers over ``MAX_HEADER_BYTES`` in all: no client of the contract needs them, and
      the HTTP parser accepts megabytes.

    Both are ``400 INVALID_REQUEST`` in the envelope, before anything is read or changed.
    """

    def __init__(self, app: ASGIApp, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self._problem(scope)
            if problem is not None:
                await error_response(InvalidRequestError(problem))(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope) -> str | None:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        for part, raw in (("path", raw_path), ("query", scope.get("query_string", b""))):
            if b"%" in raw:
                try:
                    unquote_to_bytes(raw).decode("utf-8")
                except UnicodeDecodeError:
                    return f"the {part} has percent-escapes that are not UTF-8"
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size > self.max_header_bytes:
            return f"request headers of {size} bytes; at most {self.max_header_bytes}"
        return None


SettingsT = TypeVar("SettingsT")


def settings_or_exit(model: Callable[..., SettingsT], **values: Any) -> SettingsT:
    """The service's settings, or a clear message and exit status 2.

    A setting the service could not use (a malformed URL, a short internal token) stops
    it before it listens, with one line per problem naming the flag or ``EOS_*``
    variable, instead of a traceback, or a service that starts and fails every request.
    """
    try:
        return model(**values)
    except ValidationError as exc:
        lines = []
        for problem in exc.errors():
            name = ".".join(str(p) for p in problem["loc"]) or "settings"
            flag = "--" + name.replace("_", "-")
            message = str(problem["msg"]).removeprefix("Value error, ")
            lines.append(f"error: {flag} (EOS_{name.upper()}): {message}")
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


def serve(
    service: str,
    make_app: Callable[[], FastAPI],
    *,
    host: str,
    port: int,
    log_level: str,
    log_format: str,
    graceful_shutdown_s: int,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> None:
    """Run a service in the foreground under uvicorn, with the product's structured logs.

    Logging is configured before the app is built, so start-up lines are structured too;
    uvicorn's access log stays off (one line per request costs more than a produce, and
    an access log is where a token in a query string would end up). With ``tls_cert`` and
    ``tls_key`` the service speaks HTTPS only.
    """
    import uvicorn

    from sdk.protocol.logs import UVICORN_LOG_CONFIG, configure_logging

    configure_logging(service, log_level, log_format)
    try:
        app = make_app()
    except ValueError as exc:  # a bad setting found while building (a tokens file, say)
        log.error("%s cannot start: %s", service, exc)
        raise SystemExit(2) from None
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        log_config=UVICORN_LOG_CONFIG,
        access_log=False,
        timeout_graceful_shutdown=graceful_shutdown_s,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
    )


def internal_headers(token: str | None) -> dict[str, str]:
    """Headers a coordinator or node sends on internal calls."""
    return {INTERNAL_TOKEN_HEADER: f"Bearer {token}"} if token else {}


__all__ = [
    "BodyLimit",
    "ErrorEnvelope",
    "InvalidRequestError",
    "RequestShape",
    "bears_internal_token",
    "error_response",
    "error_responses",
    "install_error_handlers",
    "internal_headers",
    "internal_token_checker",
    "serve",
]
