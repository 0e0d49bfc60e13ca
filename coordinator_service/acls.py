"""ACL bindings in the coordinator's database, and the rules every instance enforces.

The bindings are rows of ``acls``, shared by every coordinator instance. Each instance
keeps them in its ``Authorizer`` and reads them again every ``acl_refresh_ms``, at once
after changing them itself, and on a denial when they were read before the request
arrived, so a grant made at another instance is seen by the next request that needs it.
Revocations reach the other instances and the storage nodes within one refresh period.

A row that does not read as a binding (written by hand, or by a version with other rules)
must not stop the others from being read: that used to fail every refresh, so the
instance kept its old rules for good — later grants never arrived and, worse, later
revocations never took effect — and a restart refused to start at all. Such a row is
reported once (error log naming its id, ``eos_coordinator_background_entries_set_aside``
with ``loop="acls"``) and read *failing closed*: an unreadable allow grants nothing, and an
unreadable deny (or a row whose permission cannot be read) denies at least what it could
have denied — every field that cannot be read is widened to "any" (``User:*``, every
resource type, ``*``, ``all``). Deleting the row (SQL, or an ACL filter matching its
widened deny) ends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from coordinator_service.db.engine import Database
from coordinator_service.db.schema import acls
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.acl import (
    CLUSTER_RESOURCE,
    OPERATIONS,
    PRINCIPAL_RE,
    WILDCARD,
    AclBinding,
    AclFilter,
    AclSnapshot,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from eos_protocol.common import MAX_ID_LENGTH
from eos_protocol.errors import CoordinatorNotAvailableError
from eos_security.authorizer import Authorizer

log = logging.getLogger("eos.coordinator.acls")

E = TypeVar("E", bound=StrEnum)

_FIELDS = ("principal", "resource_type", "resource_name", "pattern_type", "operation",
           "permission")


@dataclass
class Unreadable:
    """A row of ``acls`` that is not a binding, and what it is read as instead."""

    row_id: int
    problem: str
    stands_for: list[AclBinding] = field(default_factory=list)


@dataclass
class ReadBindings:
    bindings: list[AclBinding]
    unreadable: list[Unreadable]


def _enum_or_none(kind: type[E], value: object) -> E | None:
    if not isinstance(value, str):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


def widened_denies(values: dict[str, object]) -> list[AclBinding]:
    """The narrowest denies that surely cover an unreadable deny: each field that does not
    read is widened to "any"."""
    principal = values["principal"]
    if not isinstance(principal, str) or not PRINCIPAL_RE.match(principal):
        principal = f"User:{WILDCARD}"
    rtype = _enum_or_none(ResourceType, values["resource_type"])
    operation = _enum_or_none(Operation, values["operation"])
    pattern = _enum_or_none(PatternType, values["pattern_type"])
    name = values["resource_name"]
    name_ok = isinstance(name, str) and 1 <= len(name) <= MAX_ID_LENGTH
    denies = []
    for each in [rtype] if rtype is not None else list(ResourceType):
        op = operation if operation in OPERATIONS[each] else Operation.ALL
        if each is ResourceType.CLUSTER:
            where = (CLUSTER_RESOURCE, PatternType.LITERAL)
        elif name_ok and pattern is not None and (name, pattern) != (
            WILDCARD, PatternType.PREFIXED
        ):
            where = (str(name), pattern)
        else:
            where = (WILDCARD, PatternType.LITERAL)
        denies.append(
            AclBinding(
                principal=principal, resource_type=each, resource_name=where[0],
                pattern_type=where[1], operation=op, permission=Permission.DENY,
            )
        )
    return denies


def _read_row(row: sa.Row[tuple[object, ...]]) -> AclBinding | Unreadable:
    values = {name: getattr(row, name) for name in _FIELDS}
    try:
        return AclBinding.model_validate(values)
    except ValidationError as exc:
        problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}"
                            for e in exc.errors())
    found = Unreadable(int(row.id), problem)
    if values["permission"] != Permission.ALLOW.value:
        found.stands_for = widened_denies(values)
    return found


def read_bindings(conn: Connection) -> ReadBindings:
    """Every row as the bindings it stands for; unreadable rows read failing closed."""
    rows = conn.execute(sa.select(acls).order_by(acls.c.id)).all()
    bindings: list[AclBinding] = []
    unreadable: list[Unreadable] = []
    for row in rows:
        read = _read_row(row)
        if isinstance(read, AclBinding):
            bindings.append(read)
        else:
            unreadable.append(read)
            bindings.extend(read.stands_for)
    return ReadBindings(bindings, unreadable)


def list_bindings(conn: Connection) -> list[AclBinding]:
    return read_bindings(conn).bindings


def create_bindings(conn: Connection, bindings: list[AclBinding], now_ms: int) -> None:
    """Insert the bindings that are not there yet (creating one twice is harmless)."""
    rows = conn.execute(sa.select(acls).order_by(acls.c.id)).all()
    existing = {read.key() for read in map(_read_row, rows) if isinstance(read, AclBinding)}
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
    doomed: list[tuple[int, AclBinding]] = []
    for row in rows:
        read = _read_row(row)
        stands_for = [read] if isinstance(read, AclBinding) else read.stands_for
        doomed.extend(
            (int(row.id), b) for b in stands_for if any(f.matches(b) for f in filters)
        )
    if doomed:
        conn.execute(acls.delete().where(acls.c.id.in_({i for i, _ in doomed})))
    return [b for _, b in doomed]


class AclRules:
    """The instance's copy of the bindings, kept fresh."""

    def __init__(self, db: Database, authorizer: Authorizer, *, refresh_interval_ms: int,
                 metrics: CoordinatorMetrics | None = None) -> None:
        self.db = db
        self.authorizer = authorizer
        self.refresh_interval_s = refresh_interval_ms / 1000
        self._lock = asyncio.Lock()
        self._metrics = metrics or CoordinatorMetrics()
        self._reported: dict[int, str] = {}  # unreadable row id -> its problem, logged once

    async def reload(self) -> None:
        async with self._lock:
            started = time.monotonic()
            read = await self.db.run(read_bindings)
            self._report(read.unreadable)
            self.authorizer.replace(read.bindings, as_of=started)

    def _report(self, unreadable: list[Unreadable]) -> None:
        """Log each unreadable row once (and again if it changes), not at every refresh."""
        seen = {u.row_id: u.problem for u in unreadable}
        for found in unreadable:
            if self._reported.get(found.row_id) == found.problem:
                continue
            self._metrics.set_aside.labels(loop="acls").inc()
            read_as = ", ".join(
                f"{b.permission.value} {b.principal} {b.operation.value} "
                f"{b.resource_type.value}:{b.resource_name} ({b.pattern_type.value})"
                for b in found.stands_for
            ) or "nothing (an allow that cannot be read grants nothing)"
            log.error(
                "ACL row %d cannot be read (%s); read as %s. The other bindings apply; "
                "delete or fix the row", found.row_id, found.problem, read_as,
                extra={"acl_row_id": found.row_id, "reason": found.problem},
            )
        self._reported = seen

    async def fresh_snapshot(self) -> AclSnapshot:
        """The bindings as the database holds them now, with the super users, for a node
        (COORDINATOR_NOT_AVAILABLE, which the nodes retry, when they cannot be read).
        Read straight from the database: this instance's own copy is left alone, so the
        nodes' polling does not drop its cached decisions."""
        try:
            read = await self.db.run(read_bindings)
        except SQLAlchemyError as exc:
            log.warning("ACLs not read for a node: %s", type(exc).__name__)
            raise CoordinatorNotAvailableError("cannot read the ACLs now; retry") from exc
        return AclSnapshot(super_users=sorted(self.authorizer.super_users), acls=read.bindings)

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
