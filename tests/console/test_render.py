"""The console without a cluster: HTML escaping of everything rendered, the fragment the
live refresh swaps in, the hanging-transaction report as the contract words it, the CSRF
check and the login cookie accepted under ``/console`` only."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.responses import PlainTextResponse

from coordinator_service.console import render
from coordinator_service.console.session import (
    CSRF_COOKIE,
    ConsoleRefusal,
    check_csrf,
    check_origin,
)
from coordinator_service.console.snapshot import HangingReport, TransactionRow, hanging_report
from coordinator_service.console.topics import (
    NodeError,
    Paging,
    PartitionRow,
    ProducerRow,
    TopicRow,
    TopicsView,
    TopicView,
)
from eos_protocol.coordinator import CreateTopicRequest
from eos_security.access import CONSOLE_COOKIE, AccessControl, Authentication, principal_of
from eos_security.authorizer import Authorizer
from eos_security.tokens import TokenRegistry, hash_token

pytestmark = pytest.mark.unit

EVIL = "<script>alert(1)</script>\"'&<img src=x onerror=alert(2)>"


def _base(**extra: Any) -> dict[str, Any]:
    context: dict[str, Any] = {
        "page": "transactions", "title": "Transactions", "principal": EVIL,
        "can_alter": True, "csrf": "tok\"en", "instance_id": EVIL, "node_id": 1,
        "cluster_id": EVIL, "taken_at": "12:00:00", "now_ms": 10_000, "notice": EVIL,
        "notice_error": False,
    }
    context.update(extra)
    return context


def _txn(tid: str, *, is_open: bool = True) -> TransactionRow:
    return TransactionRow(
        transactional_id=tid, producer_id=7, producer_epoch=2,
        state="Ongoing" if is_open else "CompleteAbort", age_ms=1500 if is_open else None,
        since_update_ms=20, timeout_ms=60_000, partitions=(("orders", 0), ("orders", 1)),
        is_open=is_open,
    )


def _transactions_page(tid: str, *, fragment: bool = False, can_alter: bool = True) -> str:
    hanging = hanging_report(200, {
        "checked_at_ms": 1, "open_on_nodes": 1,
        "hanging": [{"topic": "orders", "partition": 0, "producer_id": 9,
                     "producer_epoch": 0, "first_offset": 3, "age_ms": 5000,
                     "reason": EVIL, "transactional_id": tid,
                     "coordinator_state": None}],
    })  # fmt: skip
    context = _base(open=[_txn(tid)], ended=[_txn(tid, is_open=False)], hanging=hanging,
                    hanging_checked="12:00:00", can_alter=can_alter)
    return render.render("transactions.html", context, fragment=fragment)


def _no_raw_markup(html: str) -> None:
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "onerror=alert(2)>" not in html or "&lt;img" in html


def test_an_odd_transactional_id_is_escaped_in_text_and_attributes() -> None:
    html = _transactions_page(EVIL)
    _no_raw_markup(html)
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&amp;"
    assert html.count(escaped) >= 6  # cells, data-tid, hidden input, confirm text, ...
    # every attribute value stays one attribute: no quote of the id ends it early
    for tag in re.findall(r"<(?:tr|input|form)\b[^>]*>", html):
        assert tag.count('"') % 2 == 0, tag
    assert 'value="tok&#34;en"' in html  # the CSRF token too


def test_the_principal_notice_and_ids_of_the_frame_are_escaped() -> None:
    html = _transactions_page("plain")
    _no_raw_markup(html)
    assert "&lt;script&gt;alert(1)" in html.split("<main", 1)[0]  # principal, notice


def test_a_read_only_viewer_gets_no_abort_form() -> None:
    html = _transactions_page("plain", can_alter=False)
    assert 'class="abort"' not in html
    assert "read-only" in html
    assert 'class="abort"' in _transactions_page("plain", can_alter=True)


def test_the_fragment_is_the_content_block_alone() -> None:
    whole = _transactions_page("t-1")
    fragment = _transactions_page("t-1", fragment=True)
    assert whole.startswith("<!doctype html>")
    assert "<html" not in fragment and "<header" not in fragment
    assert 'id="open-transactions"' in fragment
    assert fragment.strip() in whole


def _topic(name: str = "orders", **counts: int) -> TopicRow:
    values = {"partitions": 2, "replication_factor": 2, "under_replicated": 0, "offline": 0,
              "lso_lag": 0, "unread": 0, **counts}
    return TopicRow(name=name, internal=name.startswith("__"), **values)


def test_partition_numbers_render_as_the_api_answers_them() -> None:
    producer = ProducerRow(producer_id=4, producer_epoch=0, last_sequence=9,
                           coordinator_epoch=1, current_txn_start_offset=1234567,
                           last_timestamp_ms=9_000)
    rows = [
        PartitionRow(topic="orders", partition=0, leader=1, leader_url="http://n1",
                     replicas=(1, 2), isr=(1,), log_start_offset=0,
                     high_watermark=1234570, last_stable_offset=1234567,
                     producers=(producer,), error=None),
        PartitionRow(topic="orders", partition=1, leader=-1, leader_url="", replicas=(2,),
                     isr=(), log_start_offset=None, high_watermark=None,
                     last_stable_offset=None, producers=(), error="no live leader"),
    ]  # fmt: skip
    view = TopicView(topic=_topic(under_replicated=1, offline=1, lso_lag=3, unread=1),
                     min_insync_replicas=1, partitions=rows,
                     paging=Paging(1, 200, 2, "/console/topics/orders"))
    html = render.render("topic.html", _base(page="topics", view=view))
    row0 = html.split('data-partition="0"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num hw">1234570</td>' in row0
    assert '<td class="num lso">1234567</td>' in row0
    assert '<td class="num lag">3</td>' in row0
    assert 'class="num isr short"' in row0  # ISR smaller than the replicas
    row1 = html.split('data-partition="1"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num hw">—</td>' in row1 and "none" in row1 and "no live leader" in row1
    assert 'data-producer-id="4"' in html and ">1234567<" in html
    assert "1 under-replicated" in html and "1 offline" in html
    assert 'class="pager"' in html and 'rel="next"' not in html  # one page only


def test_the_topic_list_sums_and_flags_and_hides_internal_topics_behind_a_toggle() -> None:
    topics = [
        _topic("orders", partitions=5000, lso_lag=42, under_replicated=3),
        _topic("payments", offline=1, unread=2),
    ]
    view = TopicsView(topics=topics, paging=Paging(1, 100, 2, "/console/topics"),
                      show_internal=False, internal_count=1,
                      node_errors=[NodeError(2, "http://n2", EVIL)])
    html = render.render("topics.html", _base(page="topics", view=view))
    _no_raw_markup(html)  # a node's error message is escaped too
    orders = html.split('data-topic="orders"', 1)[1].split("</tr>", 1)[0]
    assert 'href="/console/topics/orders"' in orders
    assert '<td class="num partitions">5000</td>' in orders
    assert '<td class="num lag">42</td>' in orders
    assert 'class="num under-replicated short">3<' in orders
    payments = html.split('data-topic="payments"', 1)[1].split("</tr>", 1)[0]
    assert 'class="down"' in html.split('data-topic="payments"', 1)[1][:20]
    assert "(2 partitions unread)" in payments and 'class="num offline short">1<' in payments
    assert 'id="internal-toggle" href="/console/topics?internal=1"' in html
    assert "Show internal topics (1)" in html
    assert 'data-node-id="2"' in html.split('id="node-errors"', 1)[1]

    shown = TopicsView(topics=[_topic("__consumer_offsets"), *topics],
                       paging=Paging(1, 100, 3, "/console/topics", (("internal", "1"),)),
                       show_internal=True, internal_count=1)
    html = render.render("topics.html", _base(page="topics", view=shown))
    assert 'id="internal-toggle" href="/console/topics"' in html
    internal = html.split('data-topic="__consumer_offsets"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="tag">internal</span>' in internal
    assert 'id="node-errors"' not in html


def test_a_long_list_links_its_pages_keeping_its_parameters() -> None:
    paging = Paging(7, 100, 2_000, "/console/topics", (("internal", "1"),))
    assert (paging.pages, paging.start, paging.stop) == (20, 600, 700)
    assert paging.window() == [1, None, 5, 6, 7, 8, 9, None, 20]
    assert paging.href(1) == "/console/topics?internal=1"
    assert paging.href(8) == "/console/topics?internal=1&page=8"
    view = TopicsView(topics=[_topic()], paging=paging, show_internal=True, internal_count=1)
    html = render.render("topics.html", _base(page="topics", view=view))
    pager = html.split('class="pager"', 1)[1].split("</nav>", 1)[0]
    assert "Topics 601\N{EN DASH}700 of 2000" in pager
    assert 'rel="prev" href="/console/topics?internal=1&amp;page=6"' in pager
    assert 'rel="next" href="/console/topics?internal=1&amp;page=8"' in pager
    assert '<span class="current" aria-current="page">7</span>' in pager
    last = Paging(3, 200, 401, "/console/topics/t")
    assert (last.pages, last.start, last.stop, last.window()) == (3, 400, 401, [1, 2, 3])
    assert Paging(1, 200, 0, "/console/topics/t").pages == 1


@pytest.mark.parametrize(("ms", "text"), [
    (None, "—"), (0, "0 ms"), (999, "999 ms"), (1500, "1.5 s"), (65_000, "1 min 05 s"),
    (7_380_000, "2 h 03 min"), (-2500, "-2.5 s"),
])  # fmt: skip
def test_durations(ms: int | None, text: str) -> None:
    assert render.duration(ms) == text


def test_a_topic_name_cannot_carry_markup() -> None:
    with pytest.raises(ValidationError):
        CreateTopicRequest(name="<script>alert(1)</script>", partitions=1)


def test_the_hanging_report_follows_the_contract_and_says_why_it_is_missing() -> None:
    report = hanging_report(200, {"checked_at_ms": 5, "open_on_nodes": 2, "hanging": [
        {"topic": "t", "partition": 1, "producer_id": 3, "producer_epoch": 4,
         "first_offset": 10, "age_ms": 99, "reason": "unknown to the coordinator",
         "transactional_id": None, "coordinator_state": None},
    ]})  # fmt: skip
    assert report.error is None and report.open_on_nodes == 2
    assert report.rows[0].first_offset == 10 and report.rows[0].transactional_id is None
    assert hanging_report(404, None).error is not None
    refused = hanging_report(403, {"error": {"code": "CLUSTER_AUTHORIZATION_FAILED",
                                             "message": "User:r may not describe"}})
    assert isinstance(refused, HangingReport) and "may not describe" in (refused.error or "")


def _request(cookie: str | None, origin: str | None = None) -> Request:
    headers = [(b"host", b"c1:8080")]
    if cookie:
        headers.append((b"cookie", f"{CSRF_COOKIE}={cookie}".encode()))
    if origin:
        headers.append((b"origin", origin.encode()))
    return Request({"type": "http", "method": "POST", "path": "/console/x", "headers": headers,
                    "query_string": b""})


def test_csrf_needs_the_browsers_own_token() -> None:
    token = "a" * 43
    check_csrf(_request(token), {"csrf": token})
    for cookie, sent in ((token, "b" * 43), (token, ""), (None, token), (None, "")):
        with pytest.raises(ConsoleRefusal) as refused:
            check_csrf(_request(cookie), {"csrf": sent})
        assert refused.value.status == 403


def test_a_form_posted_from_another_site_is_refused() -> None:
    check_origin(_request(None, "http://c1:8080"))
    check_origin(_request(None))  # no Origin header (an older browser, a script)
    with pytest.raises(ConsoleRefusal) as refused:
        check_origin(_request(None, "https://evil.example"))
    assert refused.value.status == 403


def _secured_app() -> FastAPI:
    app = FastAPI()

    @app.get("/console")
    @app.get("/v1/metadata")
    async def who(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(principal_of(request)))

    tokens = TokenRegistry.from_hashes({hash_token("secret"): "User:ops"})
    authorizer = Authorizer()
    authorizer.replace([])
    app.add_middleware(Authentication, access=AccessControl(tokens, authorizer),
                       internal_token=None)
    return app


def test_the_login_cookie_authenticates_the_console_and_nothing_else() -> None:
    async def run() -> dict[str, httpx.Response]:
        transport = httpx.ASGITransport(app=_secured_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            cookie = {"cookie": f"{CONSOLE_COOKIE}=secret"}
            return {
                "console": await client.get("/console", headers=cookie),
                "api": await client.get("/v1/metadata", headers=cookie),
                "anonymous": await client.get("/console"),
                "wrong": await client.get("/console", headers={
                    "cookie": f"{CONSOLE_COOKIE}=guess"}),
                "header": await client.get("/console",
                                           headers={"authorization": "Bearer secret"}),
            }

    answers = asyncio.run(run())
    assert answers["console"].text == "User:ops"
    assert answers["header"].text == "User:ops"
    assert answers["api"].status_code == 401  # the cookie never stands in for the header
    for name in ("anonymous", "wrong"):
        assert answers[name].status_code == 303
        assert answers[name].headers["location"] == "/console/login"
