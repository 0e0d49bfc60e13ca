"""The storage node's copy of the cluster's ACLs, fetched from a coordinator.

The bindings live in the coordinator's database; a node asks any coordinator for them
(``GET /internal/v1/acls``, internal token) at start, every ``acl_refresh_ms`` after, and
on a denial when its copy was read before the request arrived (``AccessControl``), so a
new grant works at once and a revocation takes effect within one refresh period. While the node has
never had a copy it refuses access-controlled requests with the retriable
COORDINATOR_NOT_AVAILABLE instead of guessing; once it has one, a coordinator that cannot
be reached leaves the last copy in force.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

import httpx
from pydantic import ValidationError

from eos_security.authorizer import Authorizer
from sdk.protocol.acl import AclSnapshot
from sdk.protocol.errors import CoordinatorNotAvailableError
from sdk.protocol.server import internal_headers

log = logging.getLogger("eos.node.acls")


class AclFetcher:
    """Keeps ``authorizer`` equal to the coordinator's rules."""

    def __init__(
        self,
        authorizer: Authorizer,
        coordinator_url: str | None,
        internal_token: str | None,
        *,
        refresh_interval_ms: int,
        verify: ssl.SSLContext | bool = True,
        timeout_s: float = 5.0,
    ) -> None:
        self.authorizer = authorizer
        self.url = f"{coordinator_url.rstrip('/')}/internal/v1/acls" if coordinator_url else None
        self.refresh_interval_s = refresh_interval_ms / 1000
        self._client = httpx.AsyncClient(
            timeout=timeout_s, headers=internal_headers(internal_token), verify=verify
        )
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Fetch the rules once; raises COORDINATOR_NOT_AVAILABLE when that fails."""
        if self.url is None:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL to fetch its access rules from"
            )
        async with self._lock:
            started = time.monotonic()
            try:
                response = await self._client.get(self.url)
            except httpx.HTTPError as exc:
                raise CoordinatorNotAvailableError(
                    f"cannot fetch access rules: {exc or type(exc).__name__}"
                ) from exc
            if response.status_code != 200:
                raise CoordinatorNotAvailableError(
                    f"coordinator answered {response.status_code} for the access rules"
                )
            try:
                snapshot = AclSnapshot.model_validate_json(response.content)
            except ValidationError as exc:
                raise CoordinatorNotAvailableError(f"bad access rules: {exc}") from exc
            self.authorizer.replace(snapshot.acls, snapshot.super_users, as_of=started)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except CoordinatorNotAvailableError as exc:
                log.warning("access rules not refreshed: %s", exc)
            await asyncio.sleep(self.refresh_interval_s)

    async def close(self) -> None:
        await self._client.aclose()
