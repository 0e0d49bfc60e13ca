"""The console's routes: the cluster, topics (and each topic's), consumer groups (and each
group's) and transactions pages, their fragments, login, and the two abort forms.

Pages are GETs that change nothing; the forms are POSTs that need the CSRF token
(``session.py``) and then go through the coordinator's own API, called in-process with the
viewer's token (``_api``): an abort from the console is the API's force-abort, judged by
the same ACLs (alter on the cluster) and answered with the same errors. The console checks
that right first too, so a refused form is a 403 page whether or not the API is reached.

None of it is in the OpenAPI document, which describes the API, not its pages.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from coordinator_service.api.deps import ServicesDep
from coordinator_service.console import groups as group_pages
from coordinator_service.console import render, snapshot, topics
from coordinator_service.console.session import (
    ConsoleRefusal,
    check_csrf,
    form_for_alter,
    log_in,
    log_out,
    read_form,
)
from coordinator_service.services import Services
from eos_protocol.errors import EosError
from eos_protocol.paths import join

log = logging.getLogger("eos.coordinator.console")

router = APIRouter(prefix="/console", include_in_schema=False)

#: How long an in-process API call from a form may take (a force-abort waits for its
#: state write, not for the markers).
API_TIMEOUT_S = 10.0


# --- pages ---------------------------------------------------------------------------------


async def _cluster(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
    if not snapshot.may_describe_cluster(services, viewer):
        return {"may_describe": False, "coordinators": [], "leases": [], "nodes": []}
    coordinators, leases, nodes = await snapshot.cluster_view(services, viewer)
    return {"may_describe": True, "coordinators": coordinators, "leases": leases,
            "nodes": nodes}


def _page_number(request: Request) -> int:
    """``?page=``: a whole number from 1 (1 when absent), else a 400 page."""
    text = request.query_params.get("page", "1")
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < 1:
        raise ConsoleRefusal(400, f"Bad page number {text!r}: pages are numbered from 1.")
    return int(text)


def _flag(request: Request, name: str) -> bool:
    """``?name=1`` on, ``0`` or absent off, anything else a 400 page."""
    text = request.query_params.get(name, "0")
    if text not in ("0", "1"):
        raise ConsoleRefusal(400, f"Bad value {text!r} for {name}: 1 (yes) or 0 (no).")
    return text == "1"


@router.get("")
async def cluster_page(request: Request, services: ServicesDep) -> Response:
    """Coordinators and the log partitions they lease, and the storage nodes' health."""
    return await render.page_response(request, services, "cluster", "Cluster", _cluster)


@router.get("/topics")
async def topics_page(request: Request, services: ServicesDep) -> Response:
    """Topics with partition count, replication factor, under-replicated and offline
    partitions and LSO lag; internal topics only with ``?internal=1``."""
    try:
        page, show_internal = _page_number(request), _flag(request, "internal")
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, "/console/topics")

    async def gather(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
        view = await topics.topics_view(services, viewer, page=page,
                                        show_internal=show_internal)
        return {"view": view}

    return await render.page_response(request, services, "topics", "Topics", gather,
                                      back="/console/topics")


@router.get("/topics/{name}")
async def topic_page(name: str, request: Request, services: ServicesDep) -> Response:
    """One topic's partitions, a page at a time: leader, replicas, ISR, offsets, LSO lag
    and producers."""
    try:
        page = _page_number(request)
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, "/console/topics")

    async def gather(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
        return {"view": await topics.topic_view(services, viewer, name, page=page)}

    return await render.page_response(request, services, "topics", name, gather,
                                      template="topic.html", back="/console/topics")


@router.get("/groups")
async def groups_page(request: Request, services: ServicesDep) -> Response:
    """Consumer groups with their state, member count and group epoch."""
    try:
        page = _page_number(request)
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, group_pages.GROUPS_BASE)

    async def gather(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
        return {"view": await group_pages.groups_view(services, viewer, page=page)}

    return await render.page_response(request, services, "groups", "Groups", gather,
                                      back=group_pages.GROUPS_BASE)


@router.get("/groups/{group_id:path}")
async def group_page(group_id: str, request: Request, services: ServicesDep) -> Response:
    """One group's members and assignments, and each partition's lag. The id is the rest
    of the path: a group id may hold ``/``, which its links carry as ``%2F``."""
    try:
        page = _page_number(request)
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, group_pages.GROUPS_BASE)

    async def gather(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
        return {"view": await group_pages.group_view(services, viewer, group_id, page=page)}

    return await render.page_response(request, services, "groups", group_id, gather,
                                      template="group.html", back=group_pages.GROUPS_BASE)


@router.get("/transactions")
async def transactions_page(request: Request, services: ServicesDep) -> Response:
    """Open, hanging and recently ended transactions, with abort buttons for alter."""

    async def gather(services: Services, viewer: snapshot.Viewer) -> dict[str, Any]:
        open_rows, ended = await snapshot.transactions_view(services, viewer)
        status, body = await _api(request, viewer, "GET", "/v1/admin/hanging-transactions")
        hanging = snapshot.hanging_report(status, body)
        checked = render.utc(hanging.checked_at_ms) if hanging.checked_at_ms else "—"
        return {"open": open_rows, "ended": ended, "hanging": hanging,
                "hanging_checked": checked}

    return await render.page_response(request, services, "transactions", "Transactions", gather)


@router.get("/static/{name}")
async def static(name: str) -> Response:
    found = render.static_file(name)
    if found is None:
        return Response(status_code=404)
    body, media = found
    headers = {**render.SECURITY_HEADERS, "cache-control": "max-age=300"}
    return Response(body, media_type=media, headers=headers)


# --- login ---------------------------------------------------------------------------------


@router.get("/login")
async def login_form(services: ServicesDep) -> Response:
    return render.html(render.render("login.html", {"enabled": services.access.enabled,
                                              "error": None}))


@router.post("/login")
async def login(request: Request, services: ServicesDep) -> Response:
    """Check the token against the tokens file and keep it in the session cookie."""
    tokens = services.access.tokens
    if tokens is None:
        return RedirectResponse("/console", status_code=303)
    try:
        form = await read_form(request)
    except ConsoleRefusal as refusal:
        return render.html(render.render("login.html", {"enabled": True, "error": refusal.message}),
                     refusal.status)
    token = form.get("token", "").strip()
    if not token or tokens.principal(token) is None:
        log.info("console login refused: unknown token")
        page = render.render("login.html", {"enabled": True, "error": "Unknown token."})
        return render.html(page, 401)
    response = RedirectResponse("/console", status_code=303)
    log_in(response, request, token)
    return response


@router.post("/logout")
async def logout(request: Request, services: ServicesDep) -> Response:
    try:
        check_csrf(request, await read_form(request))
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, "/console")
    response = RedirectResponse("/console/login", status_code=303)
    log_out(response)
    return response


# --- aborts --------------------------------------------------------------------------------


async def _api(
    request: Request, viewer: snapshot.Viewer, method: str, path: str,
    body: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    """Call this coordinator's own API in-process, as the viewer: its status and JSON."""
    transport = httpx.ASGITransport(app=request.app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://console.local", headers=viewer.headers(),
        timeout=API_TIMEOUT_S,
    ) as client:
        answer = await client.request(method, path, json=body)
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, None


def _api_error(status: int, body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"{body['error'].get('code')}: {body['error'].get('message')}"
    return f"HTTP {status}"


def _back(page: str, **params: str) -> RedirectResponse:
    return RedirectResponse(f"{page}?{urlencode(params)}", status_code=303)


@router.post("/transactions/abort")
async def abort_transaction(request: Request, services: ServicesDep) -> Response:
    """Force-abort a transactional id's open transaction (KIP-664), at its owner."""
    page = "/console/transactions"
    try:
        session, form = await form_for_alter(request, services)
        tid = form.get("tid", "")
        try:
            path = join("/v1/admin/transactions", tid) + "/abort"
        except EosError as exc:
            raise ConsoleRefusal(400, str(exc)) from exc
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, page)
    viewer = session.viewer
    status, body = await _api(request, viewer, "POST", path, {})
    if status == 200 or _code(body) != "NOT_COORDINATOR":
        return _abort_outcome(page, tid, status, body)
    # another instance owns the id's log partition: ask it, as the API's clients would
    status, found = await _api(
        request, viewer, "GET", f"/v1/coordinators?{urlencode({'key': tid})}"
    )
    if status != 200:
        return _abort_outcome(page, tid, status, found)
    try:
        answer = await services.http.post(
            f"{found['url']}{path}", json={}, headers=viewer.headers(), timeout=API_TIMEOUT_S
        )
        status, body = answer.status_code, answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        status, body = 503, {"error": {"code": "COORDINATOR_NOT_AVAILABLE",
                                       "message": f"the id's coordinator did not answer: {exc}"}}
    return _abort_outcome(page, tid, status, body)


def _code(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        return str(code) if code else None
    return None


def _abort_outcome(page: str, tid: str, status: int, body: Any) -> Response:
    if status == 200 and isinstance(body, dict):
        log.info("console: abort of %r requested, now %s", tid, body.get("state"))
        return _back(page, notice=f"Aborted {tid}: {body.get('state')}")
    return _back(page, error=f"Abort of {tid} failed: {_api_error(status, body)}")


@router.post("/hanging/abort")
async def abort_hanging(request: Request, services: ServicesDep) -> Response:
    """Abort a hanging transaction on one partition with a bumped epoch (KIP-664)."""
    page = "/console/transactions"
    try:
        session, form = await form_for_alter(request, services)
        try:
            target = {
                "topic": form["topic"],
                "partition": int(form["partition"]),
                "producer_id": int(form["producer_id"]),
                "producer_epoch": int(form["producer_epoch"]),
            }
        except (KeyError, ValueError) as exc:
            raise ConsoleRefusal(400, "the form names no partition and producer") from exc
    except ConsoleRefusal as refusal:
        return render.refused_response(request, services, refusal, page)
    status, body = await _api(
        request, session.viewer, "POST", "/v1/admin/hanging-transactions/abort", target
    )
    where = f"{target['topic']}/{target['partition']} producer {target['producer_id']}"
    if 200 <= status < 300:
        log.info("console: hanging transaction on %s aborted", where)
        return _back(page, notice=f"Aborted the hanging transaction on {where}")
    return _back(page, error=f"Abort on {where} failed: {_api_error(status, body)}")
