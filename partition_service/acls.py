"""The storage node's copy of the cluster's ACLs, fetched from a coordinator.

The bindings live in the coordinator's database; a node asks any coordinator (through its
``CoordinatorPool``, which falls over between instances) for them
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
import time

from pydantic import ValidationError

from eos_protocol.acl import AclSnapshot
from eos_protocol.common import read_answer_json
from eos_protocol.errors import CoordinatorNotAvailableError
from eos_security.authorizer import Authorizer
from partition_service.coordinators import CoordinatorPool

log = logging.getLogger("eos.node.acls")


class AclFetcher:
    """Keeps ``authorizer`` equal to the coordinator's rules."""

    def __init__(
        self, authorizer: Authorizer, pool: CoordinatorPool, *, refresh_interval_ms: int
    ) -> None:
        self.authorizer = authorizer
        self.pool = pool
        self.refresh_interval_s = refresh_interval_ms / 1000
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Fetch the rules once; raises COORDINATOR_NOT_AVAILABLE when that fails."""
        async with self._lock:
            started = time.monotonic()
            status, content = await self.pool.get("/internal/v1/acls")
            if status != 200:
                raise CoordinatorNotAvailableError(
                    f"coordinator answered {status} for the access rules"
                )
            try:
                snapshot = read_answer_json(AclSnapshot, content)
            except ValidationError as exc:
                raise CoordinatorNotAvailableError(f"bad access rules: {exc}") from exc
            self.authorizer.replace(snapshot.acls, snapshot.super_users, as_of=started)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except CoordinatorNotAvailableError as exc:
                log.warning("access rules not refreshed: %s", exc)
            except Exception:  # a bad answer must not end the loop: keep the last copy
                log.exception("access rules not refreshed")
            await asyncio.sleep(self.refresh_interval_s)

    async def close(self) -> None:
        return None  # the pool belongs to the app
