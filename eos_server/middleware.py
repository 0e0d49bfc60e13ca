"""ASGI middleware both services put in front of their routes: requests no route should
see are refused here, in the error envelope, before anything is read or changed."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi.telemetry import TelemetryConfig
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eos_protocol.errors import InvalidRequestError, MessageTooLargeError
from eos_server.envelope import error_response
from eos_server.path_segments import routable_path


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

#: FastAPI's native OpenTelemetry, off: the services report through their own metrics and
#: logs, and with it on, FastAPI looked for a global tracer, meter and logger provider (in
#: ``os.environ``) at every request, a fiftieth of the coordinator's CPU per transaction.
NATIVE_TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


class RequestShape:
    """ASGI middleware, outermost: refuse requests no route should ever see.

    * A path or query whose percent-escapes are not UTF-8 (``/v1/groups/%FF%FE``): the
      server would decode them with replacement characters, so distinct invalid ids would
      silently name the same group or transactional id.
    * Headers over ``MAX_HEADER_BYTES`` in all: no client of the contract needs them, and
      the HTTP parser accepts megabytes.

    Both are ``400 INVALID_REQUEST`` in the envelope, before anything is read or changed.
    A path with percent-escapes is then routed as the client sent it: an id's escaped
    ``/`` stays inside its segment (``path_segments.routable_path``).
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
            raw_path = scope.get("raw_path")
            if raw_path and b"%" in raw_path:  # an id holding "/" stays one segment
                scope = {**scope, "path": routable_path(raw_path)}
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
