"""Producer ids, unique across every coordinator instance, handed out in reserved blocks.

An instance reserves ``block_size`` ids at a time by inserting a row into
``producer_id_blocks`` whose start is one past the highest block so far; the primary key
makes two instances racing for the same block fail one insert, and the loser simply tries
the next block. Ids inside a reserved block are then given out from memory, so the database
is touched once per thousand producers (Kafka's ``ProducerIdManager``). Ids of a block left
unused when an instance stops are never reused — there are 2^63 of them.
"""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from coordinator_service.clock import Clock
from coordinator_service.db.engine import Database
from coordinator_service.db.schema import producer_id_blocks

B = producer_id_blocks


def reserve_block(conn: Connection, owner: str, size: int, now_ms: int) -> tuple[int, int]:
    """Insert the next block row and return its ``[start, end]`` (inclusive)."""
    highest = conn.execute(sa.select(sa.func.max(B.c.block_end))).scalar()
    start = 0 if highest is None else int(highest) + 1
    end = start + size - 1
    conn.execute(
        B.insert().values(block_start=start, block_end=end, owner=owner, allocated_ms=now_ms)
    )
    return start, end


class ProducerIdManager:
    """Gives out producer ids from this instance's current block."""

    def __init__(self, db: Database, *, owner: str, block_size: int, clock: Clock) -> None:
        self._db = db
        self._owner = owner
        self._size = block_size
        self._clock = clock
        self._next = 0
        self._end = -1  # no block yet
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next > self._end:
                self._next, self._end = await self._reserve()
            pid = self._next
            self._next += 1
            return pid

    async def _reserve(self) -> tuple[int, int]:
        for _ in range(50):
            try:
                return await self._db.run(
                    reserve_block, self._owner, self._size, self._clock.now_ms()
                )
            except IntegrityError:  # another instance took that block first
                continue
        raise RuntimeError("could not reserve a producer id block")
