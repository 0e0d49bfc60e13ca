"""Access control at the HTTP boundary of both services.

``Authentication`` is an ASGI middleware, outside everything else the app runs (the
coordinator's fast paths included), so no request reaches a handler unauthenticated. It
resolves the bearer token to a principal and leaves it in the ASGI scope; each route then
asks ``AccessControl.require`` for the rights its operation needs, naming the resource
(topic, group, transactional id or cluster) and getting Kafka's error code when refused.

``/internal/*`` belongs to coordinators and nodes: only the internal token passes the
routes' own check, and a client token is refused with 403 here, whatever its rights, so
not even a super user can write a marker. ``/healthz`` and ``/readyz`` (probes that say
nothing about the data) and the OpenAPI document stay open.

The coordinator's web console (``coordinator_service/console``) is reached by browsers,
which cannot add a header to a link: under ``/console`` the token may come instead from the
``CONSOLE_COOKIE`` its login form sets (HttpOnly, SameSite=Strict), and a page asked for
without one is redirected to that form. The form and the console's static files are open.

With no tokens file the services run open, as before: the principal is None and every
``require`` passes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from starlette.requests import HTTPConnection, cookie_parser
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from eos_protocol.acl import CLUSTER_RESOURCE, Operation, ResourceType
from eos_protocol.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    EosError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnauthenticatedError,
)
from eos_security.authorizer import Authorizer
from eos_security.tokens import TokenRegistry, hash_token
from eos_server.envelope import error_response

log = logging.getLogger("eos.auth")

PRINCIPAL_KEY = "eos.principal"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/redoc",
                        "/docs/oauth2-redirect"})
INTERNAL_PREFIX = "/internal/"
CONSOLE_PREFIX = "/console"
CONSOLE_COOKIE = "eos_console_token"
CONSOLE_LOGIN = "/console/login"
#: The console's style sheet and script, fetched by the login form before any token.
CONSOLE_STATIC = "/console/static/"
#: After a failed read of the rules (their source is down), requests that would need
#: another read wait this long before one is tried again instead of hammering it.
RETRY_AFTER_FAILED_READ_S = 0.5

_REFUSALS: dict[ResourceType, type[EosError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
}
_NOUNS = {
    ResourceType.TOPIC: "topic",
    ResourceType.GROUP: "group",
    ResourceType.TRANSACTIONAL_ID: "transactional id",
    ResourceType.CLUSTER: "the cluster",
}


def principal_of(connection: HTTPConnection | Scope) -> str | None:
    """The caller's principal (None when authentication is off)."""
    scope = connection.scope if isinstance(connection, HTTPConnection) else connection
    principal: str | None = scope.get(PRINCIPAL_KEY)
    return principal


async def _get_caller(request: Request) -> str | None:
    return principal_of(request)


#: A route parameter: the authenticated principal (None when authentication is off).
Caller = Annotated[str | None, Depends(_get_caller)]


def ensure_internal_token_distinct(tokens: TokenRegistry | None, internal_token: str | None
                                   ) -> None:
    """Refuse to start when the internal token is also a client token: it would let that
    client through /internal and the internal callers through every ACL."""
    if tokens is not None and internal_token and tokens.knows_hash(hash_token(internal_token)):
        raise ValueError("the internal token must not also be a client token")


class AccessControl:
    """Tokens, rules and the one place where a refusal is raised."""

    def __init__(
        self,
        tokens: TokenRegistry | None,
        authorizer: Authorizer | None = None,
        *,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.tokens = tokens
        self.authorizer = authorizer or Authorizer()
        self.refresh = refresh
        self._read_started = 0.0
        self._failed_at = -RETRY_AFTER_FAILED_READ_S  # the first attempt is never held
        self._inflight: asyncio.Future[bool] | None = None

    @property
    def enabled(self) -> bool:
        return self.tokens is not None

    def allowed(self, principal: str | None, rtype: ResourceType, name: str, op: Operation
                ) -> bool:
        """A quick yes/no for filtering lists (metadata, ListTransactions): no refresh."""
        if principal is None:
            return True
        return self.authorizer.loaded and self.authorizer.allowed(principal, rtype, name, op)

    async def require(
        self, principal: str | None, rtype: ResourceType, name: str, op: Operation
    ) -> None:
        """Raise the resource's *_AUTHORIZATION_FAILED unless ``op`` is allowed."""
        if principal is None:
            return
        await self._ensure_loaded()
        if self.authorizer.allowed(principal, rtype, name, op):
            return
        if await self._read_since(time.monotonic()) and self.authorizer.allowed(
            principal, rtype, name, op
        ):
            return
        noun = _NOUNS[rtype]
        target = noun if rtype is ResourceType.CLUSTER else f"{noun} {name!r}"
        denial = f"{principal} may not {op.value} {target}"
        log.info("denied: %s", denial)  # the audit trail of refusals (never a token)
        raise _REFUSALS[rtype](denial)

    async def require_cluster(self, principal: str | None, op: Operation) -> None:
        await self.require(principal, ResourceType.CLUSTER, CLUSTER_RESOURCE, op)

    async def require_somewhere(
        self, principal: str | None, rtype: ResourceType, op: Operation
    ) -> None:
        """Allowed ``op`` on at least one resource of ``rtype`` (else CLUSTER_AUTHORIZATION_
        FAILED, as Kafka answers an idempotent producer that may write nowhere)."""
        if principal is None:
            return
        await self._ensure_loaded()
        if self.authorizer.allowed_somewhere(principal, rtype, op):
            return
        if await self._read_since(time.monotonic()) and self.authorizer.allowed_somewhere(
            principal, rtype, op
        ):
            return
        denial = f"{principal} may not {op.value} any {_NOUNS[rtype]}"
        log.info("denied: %s", denial)
        raise ClusterAuthorizationFailedError(denial)

    async def _ensure_loaded(self) -> None:
        if not self.authorizer.loaded and self.refresh is not None and (
            self._inflight is not None or not self._recently_failed()
        ):
            await self._join_or_start_read()
        if not self.authorizer.loaded:
            raise CoordinatorNotAvailableError("access rules are not loaded yet; retry")

    async def _read_since(self, asked_at: float) -> bool:
        """Make sure the rules in force were read after ``asked_at`` (a moment after the
        request arrived, taken only once it was found refused, so an allowed request pays
        nothing), so a grant that came before the request is never refused, however
        recent; whether they are.

        A read already under way counts only if it started after the request: one that
        started before may carry rules older than the grant, so it is waited out and a
        new one started. Reads are never run side by side, so a burst of denials costs
        one read per read's duration, and none for a while after a read failed."""
        if self.refresh is None:
            return False
        while self.authorizer.loaded_at < asked_at:
            if self._inflight is None:
                if self._recently_failed():
                    return False
                self._start_read()
            started, inflight = self._read_started, self._inflight
            assert inflight is not None
            read = await asyncio.shield(inflight)
            if started >= asked_at:
                return read
        return True

    def _recently_failed(self) -> bool:
        return time.monotonic() - self._failed_at < RETRY_AFTER_FAILED_READ_S

    async def _join_or_start_read(self) -> bool:
        """One read at a time: requests that need the rules while a read is under way
        wait for that read instead of starting their own."""
        if self._inflight is None:
            self._start_read()
        assert self._inflight is not None
        return await asyncio.shield(self._inflight)

    def _start_read(self) -> None:
        self._read_started = time.monotonic()
        self._inflight = asyncio.ensure_future(self._read())
        self._inflight.add_done_callback(self._clear_inflight)

    def _clear_inflight(self, _done: asyncio.Future[bool]) -> None:
        self._inflight = None

    async def _read(self) -> bool:
        assert self.refresh is not None
        try:
            await self.refresh()
        except Exception as exc:  # the rules' source is down: keep the rules we have
            self._failed_at = time.monotonic()
            log.warning("access rules not re-read: %s", exc)
            return False
        return True


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def is_console_path(path: str) -> bool:
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def console_cookie_token(scope: Scope) -> str | None:
    """The token a logged-in browser presents to the console (None when it has none)."""
    for name, value in scope["headers"]:
        if name == b"cookie":
            token = cookie_parser(value.decode("latin-1")).get(CONSOLE_COOKIE, "").strip()
            if token:
                return token
    return None


class Authentication:
    """ASGI middleware: every request but the open paths must carry a known token."""

    def __init__(self, app: ASGIApp, *, access: AccessControl, internal_token: str | None
                 ) -> None:
        self.app = app
        self.access = access
        self._internal = internal_token.encode() if internal_token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tokens = self.access.tokens
        if (
            scope["type"] != "http" or tokens is None or scope["path"] in OPEN_PATHS
            or scope["path"] == CONSOLE_LOGIN or scope["path"].startswith(CONSOLE_STATIC)
        ):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        path: str = scope["path"]
        console = is_console_path(path)
        if token is None and console:
            token = console_cookie_token(scope)
        try:
            if path.startswith(INTERNAL_PREFIX):
                if token is not None and not self._is_internal(token) and tokens.principal(token):
                    raise ClusterAuthorizationFailedError(
                        "internal endpoints accept only the cluster's internal token"
                    )
            else:
                principal = tokens.principal(token) if token is not None else None
                if principal is None:
                    if console and scope["method"] in ("GET", "HEAD"):
                        await RedirectResponse(CONSOLE_LOGIN, status_code=303)(
                            scope, receive, send
                        )
                        return
                    reason = "a bearer token is required" if token is None else "unknown token"
                    raise UnauthenticatedError(reason)
                scope[PRINCIPAL_KEY] = principal
                if path == "/metrics":
                    await self.access.require_cluster(principal, Operation.DESCRIBE)
        except EosError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _is_internal(self, token: str) -> bool:
        return self._internal is not None and hmac.compare_digest(token.encode(), self._internal)


def install(app: FastAPI, access: AccessControl, internal_token: str | None) -> None:
    """Authenticate every request of ``app`` when a tokens file is configured (call after
    every other middleware is added, so this one is the outermost) and, always, document
    the bearer scheme in its OpenAPI, so the document does not depend on the settings."""
    if access.enabled:
        app.add_middleware(Authentication, access=access, internal_token=internal_token)
    document_bearer_auth(app)


def document_bearer_auth(app: FastAPI) -> None:
    """Declare the bearer scheme in the app's OpenAPI document: required on every operation
    except the open probes (``security: []``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A client token (`--auth-tokens-file`) or, on /internal, the "
                "cluster's internal token. Needed only when authentication is on.",
            }
        }
        schema["security"] = [{"bearer": []}]
        for path, operations in schema.get("paths", {}).items():
            if path in OPEN_PATHS:
                for operation in operations.values():
                    operation["security"] = []
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
