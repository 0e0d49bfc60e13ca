"""The calls every transaction makes, answered without FastAPI's routing and dependencies.

A transactional producer costs the coordinator three requests per transaction: add
partitions, commit (or abort), and the storage node's KIP-890 verification GET. Through
FastAPI each one walks the middleware stack, the router's match of every route, dependency
solving, ``json.loads`` plus validation of the Python objects, response-model validation
and serialisation — several times the CPU of the coordinator's own work for the call.

``HotPaths`` is an ASGI middleware placed inside the app's outermost error middleware. It
recognises those requests by method and path, parses the body with pydantic's JSON parser
(``model_validate_json``) straight into the same request models, calls the same
coordinator methods as the routes and answers with the same bytes: the response model's
JSON, or the error envelope of ``eos_server.envelope.error_response`` for an ``EosError``.
Whenever it is not certain to answer exactly as the route would — an unusual content type,
a body it cannot read in one piece or that does not validate, a path parameter FastAPI
would coerce or refuse, a missing internal token, a mounted app — it replays the request
to the app unchanged, so errors, 422s, 401s and the OpenAPI document stay those of the
routes in ``transactions.py`` and ``internal.py``, which remain the only declaration of
the contract. The caller's rights are checked by the same functions as the routes'
(``access.py``), on the principal the outer ``Authentication`` middleware left in the scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator_service.api.access import may_add_partitions, may_write_transaction
from eos_protocol.common import MAX_ID_LENGTH, TopicPartition
from eos_protocol.coordinator import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    EndTransactionRequest,
    EndTransactionResponse,
    ProducerTransactionView,
)
from eos_protocol.errors import EosError, UnknownProducerIdError
from eos_security.access import principal_of
from eos_server.envelope import error_response
from eos_server.internal import INTERNAL_TOKEN_HEADER, bears_internal_token

MAX_FAST_BODY = 64 * 1024  # larger bodies (hundreds of partitions) take the ordinary route
MAX_PRODUCER_ID = 2**63 - 1
TXN_PREFIX = "/v1/transactions/"
PRODUCER_PREFIX = "/internal/v1/producers/"

Handler = Callable[[Any, str | None, str, bytes], Awaitable[bytes]]


class _NotMine(Exception):
    """The ordinary route must answer this request."""


class HotPathState:
    """Shared with the app (``app.state.hot_paths``): a switch and a count, for tests."""

    def __init__(self) -> None:
        self.enabled = True
        self.answered = 0  # requests answered by the fast path


class HotPaths:
    """ASGI middleware: add partitions, commit, abort and the verification GET."""

    def __init__(
        self, app: ASGIApp, *, owner: FastAPI, internal_token: str | None, state: HotPathState
    ) -> None:
        self.app = app
        self._owner = owner
        self._token = internal_token
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.state.enabled or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path.startswith(TXN_PREFIX):
            await self._post(scope, receive, send, path[len(TXN_PREFIX):])
        elif method == "GET" and path.startswith(PRODUCER_PREFIX):
            await self._verification(scope, receive, send, path[len(PRODUCER_PREFIX):])
        else:
            await self.app(scope, receive, send)

    # --- POST /v1/transactions/{tid}/(partitions|commit|abort) ---------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, rest: str) -> None:
        tid, _, action = rest.partition("/")
        handler = _POST_HANDLERS.get(action)
        if handler is None or not 1 <= len(tid) <= MAX_ID_LENGTH or not _json_body(scope):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        if body is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            answer = await handler(self._owner.state.services, principal_of(scope), tid, body)
        except _NotMine:
            await self.app(scope, _replay(messages, receive), send)
            return
        except EosError as exc:
            self.state.answered += 1
            await error_response(exc)(scope, receive, send)
            return
        self.state.answered += 1
        await _send_json(send, answer)

    # --- GET /internal/v1/producers/{producer_id}/transaction ----------------------------

    async def _verification(self, scope: Scope, receive: Receive, send: Send, rest: str) -> None:
        number, _, tail = rest.partition("/")
        if (
            tail != "transaction"
            or not (number.isascii() and number.isdigit())
            or str(int(number)) != number
            or int(number) > MAX_PRODUCER_ID
            or not self._authorised(scope)
        ):
            await self.app(scope, receive, send)
            return
        producer_id = int(number)
        try:
            rec = await self._owner.state.services.coordinator.producer_record(producer_id)
            if rec is None:
                raise UnknownProducerIdError(
                    f"no transactional id has producer id {producer_id}"
                )
        except EosError as exc:
            self.state.answered += 1
            await error_response(exc)(scope, receive, send)
            return
        view = ProducerTransactionView(
            producer_id=rec.producer_id,
            producer_epoch=rec.producer_epoch,
            transactional_id=rec.transactional_id,
            state=rec.state,
            partitions=[TopicPartition(topic=t, partition=p) for t, p in rec.partitions],
        )
        self.state.answered += 1
        await _send_json(send, view.model_dump_json().encode())

    def _authorised(self, scope: Scope) -> bool:
        """The check of ``internal_token_checker``; a refusal is left to the route."""
        wanted = INTERNAL_TOKEN_HEADER.lower().encode()
        supplied = next((value for name, value in scope["headers"] if name == wanted), b"")
        return bears_internal_token(supplied.decode("latin-1"), self._token)


# --- handlers: the bodies of the routes in transactions.py ------------------------------


def _parse(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError:
        raise _NotMine from None


async def _add_partitions(services: Any, caller: str | None, tid: str, body: bytes) -> bytes:
    request: AddPartitionsRequest = _parse(AddPartitionsRequest, body)
    await may_add_partitions(services, caller, tid, request.partitions)
    results = await services.coordinator.add_partitions(tid, request)
    return AddPartitionsResponse(partitions=results).model_dump_json().encode()


async def _end(
    services: Any, caller: str | None, tid: str, body: bytes, *, commit: bool
) -> bytes:
    request: EndTransactionRequest = _parse(EndTransactionRequest, body)
    await may_write_transaction(services, caller, tid)
    state = await services.coordinator.end(
        tid, request.producer_id, request.producer_epoch, commit=commit,
        wait=request.wait_for_markers,
    )
    return EndTransactionResponse(transactional_id=tid, state=state).model_dump_json().encode()


async def _commit(services: Any, caller: str | None, tid: str, body: bytes) -> bytes:
    return await _end(services, caller, tid, body, commit=True)


async def _abort(services: Any, caller: str | None, tid: str, body: bytes) -> bytes:
    return await _end(services, caller, tid, body, commit=False)


_POST_HANDLERS: dict[str, Handler] = {
    "partitions": _add_partitions,
    "commit": _commit,
    "abort": _abort,
}


# --- ASGI plumbing -----------------------------------------------------------------------


def _json_body(scope: Scope) -> bool:
    """A JSON body with a declared, small length: what the fast path is sure to read."""
    content_type = length = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            content_type = value
        elif name == b"content-length":
            length = value
    return (
        content_type is not None
        and content_type.partition(b";")[0].strip().lower() == b"application/json"
        and length is not None
        and length.isdigit()
        and 0 < int(length) <= MAX_FAST_BODY
    )


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages (to replay) and its body, or None if it is not all there."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = iter(messages)

    async def replaying() -> Message:
        for message in pending:
            return message
        return await receive()

    return replaying


async def _send_json(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, internal_token: str | None) -> None:
    state = app.state.hot_paths = HotPathState()
    app.add_middleware(HotPaths, owner=app, internal_token=internal_token, state=state)
