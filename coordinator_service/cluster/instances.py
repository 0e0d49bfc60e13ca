"""Which coordinator instances are alive: heartbeats in ``coordinator_instances``.

Storage nodes and clients are configured with a list of coordinators, but the list an
operator wrote is only where to start: instances are added, moved and replaced. So each
instance writes ``heartbeat_ms`` every lease-renewal interval, and the cluster's metadata
names every instance whose heartbeat is younger than the lease time — the same horizon
after which its leases could be taken. Nodes (``GET /internal/v1/coordinators``) and
clients (``GET /v1/metadata``) refresh their lists from it and fall over to those
instances when the one they were using stops answering.

A failed heartbeat write is logged and tried again at the next beat: a database that is
away for a while must not end the loop.
"""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.db.schema import coordinator_instances
from eos_protocol.coordinator import NodeInfo

log = logging.getLogger("eos.coordinator.instances")


def write_heartbeat(conn: Connection, instance_pk: int, url: str, now_ms: int) -> None:
    conn.execute(
        coordinator_instances.update()
        .where(coordinator_instances.c.id == instance_pk)
        .values(heartbeat_ms=now_ms, url=url)
    )


def read_live(conn: Connection, since_ms: int) -> list[NodeInfo]:
    rows = conn.execute(
        sa.select(coordinator_instances.c.id, coordinator_instances.c.url)
        .where(coordinator_instances.c.heartbeat_ms >= since_ms)
        .order_by(coordinator_instances.c.id)
    )
    return [NodeInfo(node_id=int(r.id), url=str(r.url)) for r in rows]


class InstanceRegistry:
    """Beats for this instance and answers which instances are alive."""

    def __init__(
        self,
        db: Database,
        *,
        instance_pk: int,
        url: str,
        clock: Clock,
        lease_ms: int,
        interval_ms: int,
    ) -> None:
        self._db = db
        self._pk = instance_pk
        self._url = url
        self._clock = clock
        self._lease_ms = lease_ms
        self._interval_s = interval_ms / 1000

    async def beat(self) -> None:
        await self._db.run(write_heartbeat, self._pk, self._url, self._clock.now_ms())

    async def live(self) -> list[NodeInfo]:
        """Every instance heard from within the lease time, this one always included."""
        since = self._clock.now_ms() - self._lease_ms
        found = await self._db.run(read_live, since)
        if all(info.node_id != self._pk for info in found):
            found.append(NodeInfo(node_id=self._pk, url=self._url))
        return sorted(found, key=lambda info: info.node_id)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:  # the database may be away: beat again next time
                log.exception("heartbeat not written")
            await asyncio.sleep(self._interval_s)

    async def stop(self) -> None:
        """Say goodbye: a stopped instance drops out of the live list at once."""
        await self._db.run(write_heartbeat, self._pk, self._url, 0)
