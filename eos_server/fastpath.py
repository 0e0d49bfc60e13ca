"""Fast paths: the calls every transaction makes, answered without FastAPI's per-request work.

A transactional producer costs the services four requests per transaction: add
partitions, commit (or abort), the storage node's produce and, for the first batch to each
partition, the node's KIP-890 verification GET to the coordinator. Through FastAPI each
one walks the router's match of every route (through every included router), dependency
solving, ``json.loads`` plus validation of the Python objects, response-model validation
and serialisation: several times the CPU of the service's own work for the call.

A fast path is a typed handler bound to one declared route::

    @fast_path(add_partitions, AddPartitionsRequest)
    async def add_partitions_fast(call: FastCall[AddPartitionsRequest]) -> AddPartitionsResponse:
        return await add_partitions(call.text("tid"), call.body(), ...)

``install(app, paths)`` puts one ASGI layer in the app's middleware, inside the layers that
refuse malformed requests and authenticate callers. Everything it needs it derives from the
routes, which stay the only declaration of the contract (and of the OpenAPI document):

* the method and the path: the route's own compiled pattern, prefixes of every included
  router applied; nothing is spelt out twice;
* the path parameters: validated by the route's own FastAPI fields, so the handler gets
  the very values the route's endpoint would (``007`` is 7 to both); a value the route
  refuses goes to the route, which answers the 422;
* the checks declared as route or router dependencies (the internal token): run on the
  request as the route runs them; a refusal goes to the route, which answers it;
* the body model and the response model, checked at installation against the handler's.

Installation refuses a route the layer could not answer exactly as FastAPI does: query,
header or cookie parameters, path parameters other than plain ``str``/``int``, a response
class or response-model options of its own, dependencies that need more than the request,
or an earlier route the router would try first that may take some of its requests.

A request is answered by the handler only when the layer is sure the route would answer
the same: an ``application/json`` body read in full, parsed by pydantic's JSON parser
(``model_validate_json``) into the route's body model, the answer serialised by the route's
response model exactly as FastAPI serialises it (``TypeAdapter.dump_json``, by alias). Any
doubt — another content type, a body that is cut short or does not validate, a mounted
app (``root_path``), a ``HEAD`` — and the request, with the body already read, is replayed
to the app unchanged. A handler may decline too (``raise Decline``), before it changes
anything. An error the handler raises is answered by the app's own exception handler for
it, as ``ExceptionMiddleware`` would (so the node's error metric still counts it); one with
no handler propagates as it would from the route.

Why an ASGI layer and not an ``APIRoute`` subclass (the simpler-looking alternative: its
handler sits behind the router): the router's match through nested included routers and
``request_response``'s exit stacks cost most of what skipping dependency solving saves.
Measured in-process, CPU per request through the whole app: the coordinator's add
partitions (services stubbed out) takes about 160 µs through the plain route, 78 µs
through a route class with a fast handler and 20 µs through this layer; the node's
produce of a one-record batch about 70 µs through a route class and 40 µs through this
layer. One layer also means one set of rules for both services.

Handlers are typed end to end: ``FastCall[Body]`` in, the response model out, so mypy
checks them as it checks the routes; the layer itself holds no ``Any``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast, overload

from fastapi import FastAPI
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.convertors import StringConvertor
from starlette.datastructures import State
from starlette.requests import Request
from starlette.types import ASGIApp, HTTPExceptionHandler, Message, Receive, Scope, Send

BodyT = TypeVar("BodyT")
ModelT = TypeVar("ModelT", bound=BaseModel)
AnswerT = TypeVar("AnswerT", bound=BaseModel)

#: A route's endpoint function, as declared: the route is found by its identity.
Endpoint = object

#: Response options of a route the layer answers as FastAPI would (their defaults).
_PLAIN_RESPONSE = {
    "response_model_include": None,
    "response_model_exclude": None,
    "response_model_by_alias": True,
    "response_model_exclude_unset": False,
    "response_model_exclude_defaults": False,
    "response_model_exclude_none": False,
    "max_body_size": None,
}


class Decline(Exception):
    """Raised by a handler (or ``FastCall.body``) before it changes anything: the route
    answers this request instead."""


class FastCall(Generic[BodyT]):
    """One request as a handler sees it: validated path parameters, the body (parsed on
    demand, so a handler may choose when), the raw body bytes, the ASGI scope (for the
    caller's principal) and the app's state (for its services)."""

    __slots__ = ("_decode", "_params", "raw", "scope", "state")

    def __init__(
        self,
        scope: Scope,
        state: State,
        params: dict[str, str | int],
        raw: bytes,
        decode: Callable[[bytes], BodyT],
    ) -> None:
        self.scope = scope
        self.state = state
        self.raw = raw
        self._params = params
        self._decode = decode

    def body(self) -> BodyT:
        """The body as the route's body model; ``Decline`` if it does not validate (the
        route answers the 422, with FastAPI's own wording)."""
        try:
            return self._decode(self.raw)
        except ValidationError:
            raise Decline from None

    def text(self, name: str) -> str:
        """A ``str`` path parameter."""
        value = self._params[name]
        if not isinstance(value, str):
            raise TypeError(f"path parameter {name!r} is not a str")
        return value

    def number(self, name: str) -> int:
        """An ``int`` path parameter."""
        value = self._params[name]
        if not isinstance(value, int):
            raise TypeError(f"path parameter {name!r} is not an int")
        return value


Handler = Callable[[FastCall[BodyT]], Awaitable[AnswerT]]


@dataclass(frozen=True)
class FastPath(Generic[BodyT, AnswerT]):
    """A handler bound to the route whose endpoint is ``endpoint``."""

    endpoint: Endpoint
    handler: Handler[BodyT, AnswerT]
    decode: Callable[[bytes], BodyT]
    body_model: type[BaseModel] | None

    async def run(
        self, scope: Scope, state: State, params: dict[str, str | int], raw: bytes
    ) -> BaseModel:
        return await self.handler(FastCall(scope, state, params, raw, self.decode))


class AnyFastPath(Protocol):
    """What the layer needs of a ``FastPath``, whatever its body and answer types."""

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def body_model(self) -> type[BaseModel] | None: ...

    async def run(
        self, scope: Scope, state: State, params: dict[str, str | int], raw: bytes
    ) -> BaseModel: ...


def _no_body(_raw: bytes) -> None:
    return None


@overload
def fast_path(
    endpoint: Endpoint,
) -> Callable[[Handler[None, AnswerT]], FastPath[None, AnswerT]]: ...


@overload
def fast_path(
    endpoint: Endpoint, body: type[ModelT]
) -> Callable[[Handler[ModelT, AnswerT]], FastPath[ModelT, AnswerT]]: ...


def fast_path(
    endpoint: Endpoint, body: type[ModelT] | None = None
) -> (
    Callable[[Handler[None, AnswerT]], FastPath[None, AnswerT]]
    | Callable[[Handler[ModelT, AnswerT]], FastPath[ModelT, AnswerT]]
):
    """Decorator: the handler answers requests of the route of ``endpoint``, whose body
    model is ``body`` (none for a route without a body)."""
    if body is None:

        def bind_bodiless(handler: Handler[None, AnswerT]) -> FastPath[None, AnswerT]:
            return FastPath(endpoint, handler, _no_body, None)

        return bind_bodiless
    model = body

    def bind(handler: Handler[ModelT, AnswerT]) -> FastPath[ModelT, AnswerT]:
        return FastPath(endpoint, handler, model.model_validate_json, model)

    return bind


@dataclass
class FastPathStats:
    """``app.state.fast_paths``: a switch (tests compare both ways) and counts."""

    enabled: bool = True
    answered: int = 0  # requests the handlers answered, errors included
    replayed: int = 0  # requests matched, then handed to the route


@dataclass
class _Bound:
    """A fast path with what its route declares, derived once at installation."""

    path: AnyFastPath
    prefix: str  # the literal start of the path, a cheap first test
    pattern: re.Pattern[str]
    params: list[tuple[str, Callable[[str], str | int | None]]]
    guards: list[Callable[[Request], Awaitable[bool]]]
    dump: Callable[[BaseModel], bytes]
    status: int
    methods: frozenset[str]  # the route's, but HEAD: the route answers those (no body)
    reads_body: bool


class FastPaths:
    """ASGI middleware: answers the bound routes' requests it is sure of, replays the rest."""

    def __init__(
        self, app: ASGIApp, *, owner: FastAPI, routes: list[_Bound], stats: FastPathStats
    ) -> None:
        self.app = app
        self._owner = owner
        self._stats = stats
        self._by_method: dict[str, list[_Bound]] = {}
        for bound in routes:
            for method in bound.methods:
                self._by_method.setdefault(method, []).append(bound)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._stats.enabled or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        found = self._match(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        bound, params = found
        if params is None or not await _guards_pass(bound, scope):
            await self._replay(scope, [], receive, send)
            return
        messages: list[Message] = []
        raw = b""
        if bound.reads_body:
            if not _json_content(scope):
                await self._replay(scope, messages, receive, send)
                return
            messages, body = await _read_body(receive)
            if body is None:
                await self._replay(scope, messages, receive, send)
                return
            raw = body
        try:
            answer = await bound.path.run(scope, self._owner.state, params, raw)
        except Decline:
            await self._replay(scope, messages, receive, send)
            return
        except Exception as exc:
            handler = self._error_handler(exc)
            if handler is None:
                raise
            self._stats.answered += 1
            replay = _replaying(messages, receive)
            outcome = handler(Request(scope, replay), exc)
            response = await outcome if inspect.isawaitable(outcome) else outcome
            await response(scope, replay, send)
            return
        self._stats.answered += 1
        await _send_json(send, bound.status, bound.dump(answer))

    def _match(self, scope: Scope) -> tuple[_Bound, dict[str, str | int] | None] | None:
        """The bound route of this method and path, if any, with its path parameters (None
        if one of them is not certainly what the route would read)."""
        candidates = self._by_method.get(scope["method"])
        if not candidates:
            return None
        path: str = scope["path"]
        for bound in candidates:
            if not path.startswith(bound.prefix):
                continue
            matched = bound.pattern.match(path)
            if matched is None:
                continue
            params: dict[str, str | int] = {}
            for name, check in bound.params:
                value = check(matched.group(name))
                if value is None:
                    return bound, None
                params[name] = value
            return bound, params
        return None

    async def _replay(
        self, scope: Scope, messages: list[Message], receive: Receive, send: Send
    ) -> None:
        self._stats.replayed += 1
        await self.app(scope, _replaying(messages, receive), send)

    def _error_handler(self, exc: Exception) -> HTTPExceptionHandler | None:
        """The handler ``ExceptionMiddleware`` would pick (by class, nearest first); the
        catch-all ``Exception`` one belongs to the outermost layer, reached by re-raising."""
        handlers = self._owner.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            handler = handlers.get(cls)
            if handler is not None:
                return cast(HTTPExceptionHandler, handler)  # an HTTP request's handler
        return None


def install(app: FastAPI, paths: Sequence[AnyFastPath]) -> FastPathStats:
    """Bind each fast path to its route (after every router is included) and add the
    layer; it sits inside every middleware added after this call."""
    contexts = list(iter_route_contexts(app.router.routes))  # in the router's order
    routes = [_bind(path, contexts) for path in paths]
    stats = FastPathStats()
    app.state.fast_paths = stats
    app.add_middleware(FastPaths, owner=app, routes=routes, stats=stats)
    return stats


# --- binding: what a route declares, checked once ------------------------------------------


def _bind(path: AnyFastPath, contexts: list[RouteContext]) -> _Bound:
    found = [
        i for i, rc in enumerate(contexts)
        if isinstance(rc.original_route, APIRoute) and rc.endpoint is path.endpoint
    ]
    name = getattr(path.endpoint, "__name__", repr(path.endpoint))
    if len(found) != 1:
        raise ValueError(f"fast path {name}: {len(found)} routes have this endpoint, not one")
    route = contexts[found[0]]
    problem = _unsupported(route, path)
    if problem:
        raise ValueError(f"fast path {name}: {problem}")
    for earlier in contexts[: found[0]]:
        if _overlap(earlier, route):
            raise ValueError(f"fast path {name}: {earlier.path} may take its requests first")
    dependant = _dependant(route)
    pattern = route.path_regex
    assert isinstance(pattern, re.Pattern)
    response_model = route.response_model
    assert isinstance(response_model, type) and issubclass(response_model, BaseModel)
    adapter: TypeAdapter[BaseModel] = TypeAdapter(response_model)
    status = route.status_code

    def dump(answer: BaseModel) -> bytes:
        if type(answer) is not response_model:
            raise TypeError(f"fast path {name} answered {type(answer).__name__}")
        return adapter.dump_json(answer, by_alias=True)

    return _Bound(
        path=path,
        prefix=str(route.path).partition("{")[0],
        pattern=pattern,
        params=[
            (p.name, _reader(p.validate, route.param_convertors[p.name].convert))
            for p in dependant.path_params
        ],
        guards=[_guard(d) for d in dependant.dependencies if d.name is None],
        dump=dump,
        status=status if isinstance(status, int) else 200,
        methods=frozenset(route.methods or ()) - {"HEAD"},
        reads_body=path.body_model is not None,
    )


def _dependant(route: RouteContext) -> Dependant:
    dependant = route.dependant
    assert isinstance(dependant, Dependant)
    return dependant


def _unsupported(route: RouteContext, path: AnyFastPath) -> str | None:
    """Why the layer could not answer this route exactly as FastAPI does, if it could not."""
    dependant = _dependant(route)
    if dependant.query_params or dependant.header_params or dependant.cookie_params:
        return "the route reads query, header or cookie parameters"
    body_field = route.body_field
    declared = None if body_field is None else body_field.field_info.annotation
    if declared is not path.body_model or getattr(route, "_embed_body_fields", False):
        return f"the route's body is {declared!r}, the handler's {path.body_model!r}"
    for name, convertor in route.param_convertors.items():
        if not isinstance(convertor, StringConvertor):
            return f"path parameter {name!r} has a convertor"
    for param in dependant.path_params:
        if param.field_info.annotation not in (str, int) or param.alias != param.name:
            return f"path parameter {param.name!r} is not a plain str or int"
    for dependency in dependant.dependencies:
        if not _request_only(dependency):
            return f"dependency {dependency.call!r} needs more than the request"
    if not isinstance(route.response_class, DefaultPlaceholder):
        return "the route has its own response class"
    for option, default in _PLAIN_RESPONSE.items():
        if getattr(route, option, default) != default:
            return f"the route sets {option}"
    model = route.response_model
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return "the route has no pydantic response model"
    return None


def _request_only(dependency: Dependant) -> bool:
    """A dependency of the request alone (a check, a read of the app's state)."""
    return dependency.call is not None and not (
        dependency.path_params or dependency.query_params or dependency.header_params
        or dependency.cookie_params or dependency.body_params or dependency.dependencies
        or inspect.isasyncgenfunction(dependency.call)
        or inspect.isgeneratorfunction(dependency.call)
    )


def _overlap(earlier: RouteContext, route: RouteContext) -> bool:
    """Whether a route the router tries first may take some of this route's requests: it
    shares a method (a mount takes them all) and the two paths match each other's
    templates (``{tid}`` matches a parameter's ``[^/]+``, a literal matches itself)."""
    theirs = getattr(earlier, "path_regex", None)
    if not isinstance(theirs, re.Pattern):
        return False
    methods = getattr(earlier, "methods", None)
    if methods is not None and not set(methods) & set(route.methods or ()):
        return False
    mine = route.path_regex
    assert isinstance(mine, re.Pattern)
    their_format = str(getattr(earlier, "path_format", ""))
    return bool(theirs.match(str(route.path_format)) or mine.match(their_format))


def _reader(
    validate: Callable[[str], tuple[object, object]],
    convert: Callable[[str], object],
) -> Callable[[str], str | int | None]:
    """A path parameter as the route's own convertor reads it (an escaped ``/`` back to
    ``/``) and its own field validates it (so the very value its endpoint would get:
    ``007`` is read as 7 by both), or None when the route refuses it."""

    def read(raw: str) -> str | int | None:
        converted = convert(raw)
        if not isinstance(converted, str):
            return None
        value, errors = validate(converted)
        if errors or isinstance(value, bool) or not isinstance(value, str | int):
            return None
        return value

    return read


def _guard(dependency: Dependant) -> Callable[[Request], Awaitable[bool]]:
    """A check the route declares as a dependency: true when it passes on this request."""
    call = dependency.call
    assert call is not None
    keyword = dependency.request_param_name

    async def passes(request: Request) -> bool:
        try:
            outcome = call(**{keyword: request}) if keyword else call()
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            return False  # the route runs it again and answers the refusal
        return True

    return passes


async def _guards_pass(bound: _Bound, scope: Scope) -> bool:
    if not bound.guards:
        return True
    request = Request(scope)
    for guard in bound.guards:
        if not await guard(request):
            return False
    return True


# --- ASGI plumbing -------------------------------------------------------------------------


def _json_content(scope: Scope) -> bool:
    """Whether the body is declared ``application/json``: the one type parsed here."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.partition(b";")[0].strip().lower() == b"application/json")
    return False


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


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    if not messages:
        return receive
    pending = iter(messages)

    async def replay() -> Message:
        for message in pending:
            return message
        return await receive()

    return replay


async def _send_json(send: Send, status: int, body: bytes) -> None:
    """The head and body FastAPI's ``JSONResponse`` sends for the same bytes."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
