"""ACL bindings in the coordinator's database, and the rules every instance enforces.

The bindings are rows of ``acls``, shared by every coordinator instance. Each instance
keeps them in its ``Authorizer`` and reads them again every ``acl_refresh_ms``, at once
after changing them itself, and on a denial when they were read before the request
arrived, so a grant made at another instance is seen by the next request that needs it.
Revocations reach the other instances and the storage nodes within one refresh period.
"""

from __future__ import annotations

import asyncio
import logging
import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from coordinator_service.db.engine import Database
from coordinator_service.db.schema import acls
from eos_security.authorizer import Authorizer
from sdk.protocol.acl import AclBinding, AclFilter, AclSnapshot
from sdk.protocol.errors import CoordinatorNotAvailableError

log = logging.getLogger("eos.coordinator.acls")

_FIELDS = ("principal", "resource_type", "resource_name", "pattern_type", "operation",
           "permission")


def _binding(row: sa.Row[tuple[object, ...]]) -> AclBinding:
    return AclBinding.model_validate({name: getattr(row, name) for name in _FIELDS})


def list_bindings(conn: Connection) -> list[AclBinding]:
    rows = conn.execute(sa.select(acls).order_by(acls.c.id)).all()
    return [_binding(row) for row in rows]


def create_bindings(conn: Connection, bindings: list[AclBinding], now_ms: int) -> None:
    """Insert the bindings that are not there yet (creating one twice is harmless)."""
    existing = {b.key() for b in list_bindings(conn)}
    fresh: dict[tuple[str, ...], AclBinding] = {}
    for binding in bindings:
        if binding.key() not in existing:
            fresh.setdefault(binding.key(), binding)
    if fresh:
        conn.execute(
            acls.insert(),
            [
                {**dict(zip(_FIELDS, key, strict=True)), "created_ms": now_ms}
                for key in fresh
            ],
        )


def delete_bindings(conn: Connection, filters: list[AclFilter]) -> list[AclBinding]:
    """Delete every binding some filter matches; answer the deleted ones."""
    rows = conn.execute(sa.select(acls).order_by(acls.c.id)).all()
    doomed = [(row.id, _binding(row)) for row in rows]
    doomed = [(i, b) for i, b in doomed if any(f.matches(b) for f in filters)]
    if doomed:
        conn.execute(acls.delete().where(acls.c.id.in_([i for i, _ in doomed])))
    return [b for _, b in doomed]


class AclRules:
    """The instance's copy of the bindings, kept fresh."""

    def __init__(self, db: Database, authorizer: Authorizer, *, refresh_interval_ms: int
                 ) -> None:
        self.db = db
        self.authorizer = authorizer
        self.refresh_interval_s = refresh_interval_ms / 1000
        self._lock = asyncio.Lock()

    async def reload(self) -> None:
        async with self._lock:
            started = time.monotonic()
            bindings = await self.db.run(list_bindings)
            self.authorizer.replace(bindings, as_of=started)

    async def fresh_snapshot(self) -> AclSnapshot:
        """The bindings as the database holds them now, with the super users, for a node
        (COORDINATOR_NOT_AVAILABLE, which the nodes retry, when they cannot be read).
        Read straight from the database: this instance's own copy is left alone, so the
        nodes' polling does not drop its cached decisions."""
        try:
            bindings = await self.db.run(list_bindings)
        except SQLAlchemyError as exc:
            log.warning("ACLs not read for a node: %s", type(exc).__name__)
            raise CoordinatorNotAvailableError("cannot read the ACLs now; retry") from exc
        return AclSnapshot(super_users=sorted(self.authorizer.super_users), acls=bindings)

    async def create(self, bindings: list[AclBinding], now_ms: int) -> None:
        try:
            await self.db.run(create_bindings, bindings, now_ms)
        except IntegrityError:
            # another instance inserted one of them meanwhile: the rest still go in
            await self.db.run(create_bindings, bindings, now_ms)
        await self.reload()

    async def delete(self, filters: list[AclFilter]) -> list[AclBinding]:
        deleted = await self.db.run(delete_bindings, filters)
        await self.reload()
        return deleted

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            try:
                await self.reload()
            except Exception:
                log.exception("could not re-read the ACLs; keeping the current ones")
