"""Turning the gathered rows into HTML: the Jinja2 environment, its filters and pages.

Autoescaping is on for every template and ``StrictUndefined`` turns a misspelt variable
into an error instead of an empty cell, so every transactional id, topic name, principal
and error message is HTML-escaped wherever it lands, in text or in an attribute: a
transactional id may hold any character (``<script>`` included), and topic names, though
limited to ``[A-Za-z0-9._-]``, get the same treatment rather than a proof that they need
none.

A page is one template extending ``base.html``; its ``content`` block alone is the
*fragment* the live refresh fetches (``?fragment=1``) and swaps in, so the first render and
every refresh come from the same code. Every answer carries a Content-Security-Policy that
allows only this origin's script and style sheet (no inline script), ``nosniff`` and
``no-store``.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Request
from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template
from starlette.responses import HTMLResponse, Response

from coordinator_service.console import snapshot
from coordinator_service.console.session import ConsoleRefusal, Session, keep_csrf, session_of
from coordinator_service.services import Services

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

#: The pages of the navigation bar: key, address, label.
PAGES = (
    ("cluster", "/console", "Cluster"),
    ("topics", "/console/topics", "Topics"),
    ("groups", "/console/groups", "Groups"),
    ("transactions", "/console/transactions", "Transactions"),
)
#: How often an open page fetches its fragment again.
REFRESH_MS = 2000

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

#: The heading of an error page, by status (any other: "Refused").
ERROR_TITLES = {400: "Bad request", 404: "Not found"}

#: What a page adds to the frame: its own rows, gathered as the viewer.
Gather = Callable[[Services, snapshot.Viewer], Awaitable[dict[str, Any]]]

#: The static files, by name: their media types (nothing else under ``static/`` is served).
STATIC_TYPES = {"console.css": "text/css; charset=utf-8",
                "console.js": "text/javascript; charset=utf-8"}


def duration(ms: int | None) -> str:
    """A short human duration: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if ms is None:
        return "—"
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def number(value: int | None) -> str:
    """An offset or a count, digits only (what the API answers), or a dash for unknown."""
    return "—" if value is None else str(value)


def node_list(ids: tuple[int, ...] | list[int]) -> str:
    return ", ".join(str(i) for i in ids) if ids else "—"


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters["duration"] = duration
    env.filters["number"] = number
    env.filters["nodes"] = node_list
    return env


_ENV = _environment()


def template(name: str) -> Template:
    return _ENV.get_template(name)


def render(name: str, context: dict[str, Any], *, fragment: bool = False) -> str:
    """The whole page, or (``fragment``) only its ``content`` block."""
    page = template(name)
    values = {"pages": PAGES, "refresh_ms": REFRESH_MS, **context}
    if not fragment:
        return page.render(values)
    block = page.blocks["content"]
    return "".join(block(page.new_context(values)))


def static_file(name: str) -> tuple[bytes, str] | None:
    """A static file's bytes and media type; None for any name not in ``STATIC_TYPES``."""
    media = STATIC_TYPES.get(name)
    if media is None:
        return None
    return (STATIC / name).read_bytes(), media


def utc(ms: int) -> str:
    """A wall-clock time of day (UTC) for "as of" lines."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%H:%M:%S")


def html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def frame(
    request: Request, services: Services, session: Session, page: str, title: str
) -> dict[str, Any]:
    """What ``base.html`` needs: who is looking, what they may do, the flash notice."""
    now = services.clock.now_ms()
    return {
        "page": page,
        "title": title,
        "principal": session.viewer.principal,
        "can_alter": snapshot.may_alter_cluster(services, session.viewer),
        "csrf": session.csrf,
        "instance_id": services.settings.instance_id,
        "node_id": services.node_id,
        "cluster_id": services.metadata.cluster_id,
        "taken_at": utc(now),
        "now_ms": now,
        "notice": request.query_params.get("notice") or request.query_params.get("error"),
        "notice_error": "error" in request.query_params,
    }


async def page_response(
    request: Request, services: Services, page: str, title: str, gather: Gather,
    *, template: str | None = None, back: str = "/console",
) -> Response:
    """A page (or with ``?fragment=1`` its content alone) with the viewer's rows.

    ``page`` is the navigation entry it belongs to, ``template`` its template when not
    ``{page}.html``. A ``ConsoleRefusal`` from ``gather`` (an unknown topic, a page past
    the last) becomes an error page with its status and a link to ``back``.
    """
    session = session_of(request)
    context = frame(request, services, session, page, title)
    try:
        context.update(await gather(services, session.viewer))
    except ConsoleRefusal as refusal:
        return refused_response(request, services, refusal, back)
    fragment = request.query_params.get("fragment") == "1"
    response = html(render(template or f"{page}.html", context, fragment=fragment))
    keep_csrf(response, request, session)
    return response


def refused_response(
    request: Request, services: Services, refusal: ConsoleRefusal, back: str
) -> Response:
    """A refused form or page as a page with the refusal's status (403, 404, 400, ...)."""
    session = session_of(request)
    context = frame(request, services, session, "", ERROR_TITLES.get(refusal.status, "Refused"))
    context.update(message=refusal.message, back=back, notice=None)
    response = html(render("error.html", context), refusal.status)
    keep_csrf(response, request, session)
    return response
