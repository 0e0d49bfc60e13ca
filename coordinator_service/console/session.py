"""The browser's side of the console's security: the login cookie and the CSRF token.

A browser cannot add an ``Authorization`` header to a link, so the login form takes the
operator's bearer token once and stores it in ``CONSOLE_COOKIE``: HttpOnly (no script
reads it), SameSite=Strict (no other site's page sends it), limited to ``/console`` and
Secure when the coordinator speaks HTTPS. The authentication middleware
(``eos_security.access``) accepts that cookie under ``/console`` as it accepts the header,
so a page is judged by exactly the same tokens and ACLs as the API.

Every state-changing form (abort, log out) also carries a CSRF token, compared with the
``CSRF_COOKIE`` the browser got with the page (a double-submit token, fixed per browser
session): SameSite already keeps other sites' forms from carrying the cookies, and the
token also stops a request whose cookie was sent but whose author could not read a page.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from starlette.responses import Response

from coordinator_service.console.snapshot import Viewer
from coordinator_service.services import Services
from eos_protocol.acl import Operation
from eos_protocol.errors import EosError
from eos_security.access import (
    CONSOLE_COOKIE,
    CONSOLE_PREFIX,
    bearer_token,
    console_cookie_token,
    principal_of,
)

CSRF_COOKIE = "eos_console_csrf"
CSRF_FIELD = "csrf"
#: The largest form the console accepts: an abort names one id or one partition.
MAX_FORM_BYTES = 8192
FORM_TYPE = "application/x-www-form-urlencoded"


class ConsoleRefusal(Exception):
    """A console request refused before anything changed; shown as a page with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Session:
    """One request's viewer and the CSRF token its forms carry (``fresh``: set it)."""

    viewer: Viewer
    csrf: str
    fresh: bool


def viewer_of(request: Request) -> Viewer:
    """The authenticated principal and the token it came with (header first, as the
    middleware reads them)."""
    token = bearer_token(request.scope) or console_cookie_token(request.scope)
    return Viewer(principal=principal_of(request), token=token)


def session_of(request: Request) -> Session:
    existing = request.cookies.get(CSRF_COOKIE, "")
    if len(existing) >= 32:
        return Session(viewer_of(request), existing, fresh=False)
    return Session(viewer_of(request), secrets.token_urlsafe(32), fresh=True)


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def keep_csrf(response: Response, request: Request, session: Session) -> None:
    """Give the browser its CSRF cookie with the first page that carries the token."""
    if session.fresh:
        response.set_cookie(
            CSRF_COOKIE, session.csrf, path=CONSOLE_PREFIX, httponly=True, samesite="strict",
            secure=_secure(request),
        )


def log_in(response: Response, request: Request, token: str) -> None:
    """Store the token for the console's later requests (a browser session cookie)."""
    response.set_cookie(
        CONSOLE_COOKIE, token, path=CONSOLE_PREFIX, httponly=True, samesite="strict",
        secure=_secure(request),
    )


def log_out(response: Response) -> None:
    response.delete_cookie(CONSOLE_COOKIE, path=CONSOLE_PREFIX)
    response.delete_cookie(CSRF_COOKIE, path=CONSOLE_PREFIX)


def check_origin(request: Request) -> None:
    """Refuse (403) a form a browser says another site's page posted. The login form
    has no CSRF token yet (nothing to compare it with), so this is what keeps another
    site from logging a browser in under a token of its choosing."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise ConsoleRefusal(403, "a form from another site is not accepted")


async def read_form(request: Request) -> dict[str, str]:
    """A small URL-encoded form, one value per field (the console's forms send no files
    and need no multipart parser), posted from a page of this site."""
    check_origin(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != FORM_TYPE:
        raise ConsoleRefusal(415, f"expected a form ({FORM_TYPE})")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise ConsoleRefusal(413, "form too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise ConsoleRefusal(400, "the form is not UTF-8") from exc
    return {name: values[-1] for name, values in fields.items()}


def check_csrf(request: Request, form: dict[str, str]) -> None:
    """Refuse (403) a form whose token is not the one this browser was given."""
    expected = request.cookies.get(CSRF_COOKIE, "")
    sent = form.get(CSRF_FIELD, "")
    if not expected or not hmac.compare_digest(expected.encode(), sent.encode()):
        raise ConsoleRefusal(403, "the form's CSRF token does not match this browser's; "
                             "reload the page and try again")


async def form_for_alter(request: Request, services: Services) -> tuple[Session, dict[str, str]]:
    """The submitted form, once its origin, its CSRF token and the viewer's alter right on
    the cluster are checked (with a fresh read of the rules on a denial, as the API does)."""
    session = session_of(request)
    form = await read_form(request)
    check_csrf(request, form)
    try:
        await services.access.require_cluster(session.viewer.principal, Operation.ALTER)
    except EosError as exc:
        raise ConsoleRefusal(exc.http_status, str(exc)) from exc
    return session, form
