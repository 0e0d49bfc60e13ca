"""The cluster's internal token: what a coordinator and a storage node show each other.

Internal endpoints (markers, verification, partition creation, ACL reads) change or reveal
state no client may touch, so each requires ``Authorization: Bearer <internal token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from eos_protocol.errors import UnauthenticatedError

INTERNAL_TOKEN_HEADER = "Authorization"


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


def internal_headers(token: str | None) -> dict[str, str]:
    """Headers a coordinator or node sends on internal calls."""
    return {INTERNAL_TOKEN_HEADER: f"Bearer {token}"} if token else {}
