"""The fast-path layer (``eos_server/fastpath.py``) on an app of its own: every request is
sent through the fast path and through the route, and both answers must be the same bytes.

The app declares what the services' hot routes declare — constrained ``str`` and ``int``
path parameters under a router prefix, a JSON body, a router-level internal-token check,
errors in the envelope counted by the app's handler — and a few requests the layer must
leave to the route. A disagreement in status, headers or body fails the comparison.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Message

from eos_protocol.errors import InvalidRecordError, UnknownTopicOrPartitionError
from eos_server import fastpath
from eos_server.envelope import install_error_handlers
from eos_server.fastpath import Decline, FastCall, FastPathStats, fast_path
from eos_server.internal import internal_token_checker

pytestmark = pytest.mark.unit

TOKEN = "fast-path-internal-token-0123456789"
INTERNAL = {"Authorization": f"Bearer {TOKEN}"}


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item: str = Field(min_length=1)
    quantity: int = Field(ge=1)


class Receipt(BaseModel):
    shop: str
    number: int
    item: str
    total: int
    note: str | None = Field(default=None, serialization_alias="remark")


class Stock(BaseModel):
    number: int
    left: int


ShopPath = Annotated[str, Path(min_length=2, max_length=8, pattern="^[a-z]+$")]
NumberPath = Annotated[int, Path(ge=0, le=1000)]

shops = APIRouter(prefix="/v1/shops/{shop}")
internal = APIRouter(prefix="/internal", dependencies=[Depends(internal_token_checker(TOKEN))])


@shops.post("/orders/{number}", response_model=Receipt)
async def place_order(shop: ShopPath, number: NumberPath, body: Order) -> Receipt:
    if body.item == "missing":
        raise UnknownTopicOrPartitionError(f"no item {body.item!r} in {shop}")
    if body.item == "broken":
        raise RuntimeError("a bug")
    note = "bulk" if body.quantity > 10 else None
    return Receipt(shop=shop, number=number, item=body.item, total=3 * body.quantity, note=note)


@internal.get("/stock/{number}", response_model=Stock)
async def stock(number: int = Path(ge=0, le=2**63 - 1)) -> Stock:
    if number == 404:
        raise InvalidRecordError("no such number")
    return Stock(number=number, left=number % 7)


@fast_path(place_order, Order)
async def place_order_fast(call: FastCall[Order]) -> Receipt:
    if call.text("shop") == "closed":
        raise Decline
    return await place_order(call.text("shop"), call.number("number"), call.body())


@fast_path(stock)
async def stock_fast(call: FastCall[None]) -> Stock:
    return await stock(call.number("number"))


def build_app(errors: list[str]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, errors.append)
    app.include_router(shops)
    app.include_router(internal)
    fastpath.install(app, [place_order_fast, stock_fast])
    return app


@pytest.fixture
def app() -> FastAPI:
    return build_app([])


def order(item: str = "tea", quantity: int = 2) -> dict[str, object]:
    return {"item": item, "quantity": quantity}


#: (method, path, json body or raw bytes, headers) of every kind of request
REQUESTS: list[tuple[str, str, object, dict[str, str]]] = [
    ("POST", "/v1/shops/corner/orders/7", order(), {}),
    ("POST", "/v1/shops/corner/orders/7", order(quantity=12), {}),  # a serialisation alias
    ("POST", "/v1/shops/corner/orders/0", order("missing"), {}),  # an error, counted
    ("POST", "/v1/shops/corner/orders/1000", order(), {}),
    ("POST", "/v1/shops/corner/orders/1001", order(), {}),  # out of range: 422
    ("POST", "/v1/shops/corner/orders/007", order(), {}),  # 7 to both
    ("POST", "/v1/shops/corner/orders/+7", order(), {}),  # 7 to both as well
    ("POST", "/v1/shops/corner/orders/-1", order(), {}),
    ("POST", "/v1/shops/corner/orders/x", order(), {}),
    ("POST", "/v1/shops/Corner/orders/7", order(), {}),  # the pattern refuses it
    ("POST", "/v1/shops/c/orders/7", order(), {}),  # too short
    ("POST", "/v1/shops/closed/orders/7", order(), {}),  # the handler declines
    ("POST", "/v1/shops/corner/orders/7", order(quantity=0), {}),  # body refused: 422
    ("POST", "/v1/shops/corner/orders/7", {**order(), "extra": 1}, {}),
    ("POST", "/v1/shops/corner/orders/7", b"{not json", {"content-type": "application/json"}),
    ("POST", "/v1/shops/corner/orders/7", b"", {"content-type": "application/json"}),
    ("POST", "/v1/shops/corner/orders/7", b'{"item": "tea", "quantity": 2}',
     {"content-type": "text/plain"}),
    ("POST", "/v1/shops/corner/orders/7", b'{"item": "tea", "quantity": 2}',
     {"content-type": "application/json; charset=utf-8"}),
    ("POST", "/v1/shops/corner/orders/7", b'{"item": "tea", "quantity": 2}',
     {"content-type": "application/merge-patch+json"}),
    ("POST", "/v1/shops/corner/orders/7", b'{"item": "tea", "quantity": "2"}',
     {"content-type": "application/json"}),
    ("POST", "/v1/shops/corner/orders/7/", order(), {}),
    ("PUT", "/v1/shops/corner/orders/7", order(), {}),
    ("GET", "/internal/stock/42", None, INTERNAL),
    ("GET", "/internal/stock/404", None, INTERNAL),
    ("GET", "/internal/stock/042", None, INTERNAL),
    ("GET", "/internal/stock/9223372036854775808", None, INTERNAL),
    ("GET", "/internal/stock/42", None, {}),  # the router's check refuses it
    ("GET", "/internal/stock/42", None, {"Authorization": "Bearer wrong"}),
    ("GET", "/internal/stock/42", None, {"Authorization": f"bearer {TOKEN}"}),
    ("HEAD", "/internal/stock/42", None, INTERNAL),
]


async def _send(app: FastAPI, requests: list[tuple[str, str, object, dict[str, str]]]
                ) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    answers = []
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        for method, path, body, headers in requests:
            if isinstance(body, bytes):
                response = await client.request(method, path, content=body, headers=headers)
            elif body is None:
                response = await client.request(method, path, headers=headers)
            else:
                response = await client.request(method, path, json=body, headers=headers)
            answers.append((response.status_code, list(response.headers.items()),
                            response.content))
    return answers


def both_ways(app: FastAPI, requests: list[tuple[str, str, object, dict[str, str]]]
              ) -> tuple[list[tuple[int, list[tuple[str, str]], bytes]], ...]:
    stats: FastPathStats = app.state.fast_paths
    stats.enabled = False
    routed = asyncio.run(_send(app, requests))
    stats.enabled = True
    fast = asyncio.run(_send(app, requests))
    return routed, fast


def test_fast_path_and_route_answer_the_same_bytes() -> None:
    routed_errors: list[str] = []
    fast_errors: list[str] = []
    routed_app, fast_app = build_app(routed_errors), build_app(fast_errors)
    routed_app.state.fast_paths.enabled = False
    routed = asyncio.run(_send(routed_app, REQUESTS))
    fast = asyncio.run(_send(fast_app, REQUESTS))
    for request, expected, got in zip(REQUESTS, routed, fast, strict=True):
        assert got == expected, request[:2]
    assert fast_errors == routed_errors  # errors reach the app's handler (and its metric)
    stats = fast_app.state.fast_paths
    assert routed_app.state.fast_paths.answered == 0
    # answered: eight orders (one an error) and four stock reads (one an error); replayed:
    # every other request that named a fast route (HEAD, PUT and ``/7/`` name none)
    assert (stats.answered, stats.replayed) == (12, 15)


def test_a_bug_in_a_handler_is_the_same_500(app: FastAPI) -> None:
    routed, fast = both_ways(app, [("POST", "/v1/shops/corner/orders/7", order("broken"), {})])
    assert routed == fast
    assert routed[0][0] == 500 and b"INTERNAL" in routed[0][2]


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, object]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("shop", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"host", b"shop"), *headers],
    }


async def _asgi(app: FastAPI, scope: dict[str, object], messages: list[Message]
                ) -> list[Message]:
    pending = iter(messages)
    sent: list[Message] = []

    async def receive() -> Message:
        return next(pending, {"type": "http.disconnect"})

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    "messages",
    [
        # a body in three pieces, without a declared length (chunked)
        [{"type": "http.request", "body": b'{"item": ', "more_body": True},
         {"type": "http.request", "body": b'"tea", "quantity"', "more_body": True},
         {"type": "http.request", "body": b": 3}", "more_body": False}],
        # the client goes away half-way through the body
        [{"type": "http.request", "body": b'{"item": ', "more_body": True},
         {"type": "http.disconnect"}],
    ],
    ids=["chunked", "disconnect"],
)
def test_bodies_in_pieces(app: FastAPI, messages: list[Message]) -> None:
    scope = _scope("/v1/shops/corner/orders/7", [(b"content-type", b"application/json")])
    stats: FastPathStats = app.state.fast_paths
    stats.enabled = False
    routed = asyncio.run(_asgi(app, dict(scope), messages))
    stats.enabled = True
    fast = asyncio.run(_asgi(app, dict(scope), messages))
    assert fast == routed


def test_mounted_apps_are_left_to_the_routes(app: FastAPI) -> None:
    scope = {**_scope("/v1/shops/corner/orders/7", [(b"content-type", b"application/json")]),
             "root_path": "/shop"}
    body: list[Message] = [{"type": "http.request", "body": b'{"item":"tea","quantity":1}'}]
    asyncio.run(_asgi(app, scope, body))
    stats: FastPathStats = app.state.fast_paths
    assert (stats.answered, stats.replayed) == (0, 0)


# --- installation: what cannot be answered exactly as the route does is refused --------


@pytest.fixture
def bare() -> Iterator[FastAPI]:
    app = FastAPI()
    app.include_router(shops)
    app.include_router(internal)
    yield app


def test_a_handler_needs_its_route(bare: FastAPI) -> None:
    async def nowhere() -> Stock:
        return Stock(number=0, left=0)

    @fast_path(nowhere)
    async def lost(call: FastCall[None]) -> Stock:
        return await nowhere()

    with pytest.raises(ValueError, match="0 routes"):
        fastpath.install(bare, [lost])


def test_the_body_model_is_the_routes(bare: FastAPI) -> None:
    @fast_path(place_order, Stock)
    async def wrong(call: FastCall[Stock]) -> Receipt:
        raise Decline

    with pytest.raises(ValueError, match="body"):
        fastpath.install(bare, [wrong])


def test_query_parameters_are_not_read(bare: FastAPI) -> None:
    @bare.get("/v1/search", response_model=Stock)
    async def search(q: Annotated[int, Query()]) -> Stock:
        return Stock(number=q, left=0)

    @fast_path(search)
    async def search_fast(call: FastCall[None]) -> Stock:
        raise Decline

    with pytest.raises(ValueError, match="query"):
        fastpath.install(bare, [search_fast])


def test_an_earlier_route_that_takes_the_same_paths_is_refused() -> None:
    app = FastAPI()

    @app.post("/v1/shops/outlet/orders/{number}", response_model=Receipt)
    async def outlet(number: int, body: Order) -> Receipt:
        raise Decline

    app.include_router(shops)
    with pytest.raises(ValueError, match="may take its requests"):
        fastpath.install(app, [place_order_fast])
