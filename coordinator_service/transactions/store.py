"""Reads and fenced writes of transaction records.

Every write names the lease it is made under (``LeaseToken``) and checks it in the same SQL
statement::

    UPDATE transactions SET ... WHERE transactional_id = :tid
      AND EXISTS (SELECT 1 FROM leases WHERE log_partition = :p AND owner = :me
                  AND coordinator_epoch = :epoch AND expires_at_ms > :now FOR SHARE)

so a paused ex-owner's late write matches no row and changes nothing. On PostgreSQL the
``FOR SHARE`` lock on the lease row makes a takeover (an UPDATE of that row) wait for writes
already under way, and makes a write that raced a takeover re-read the lease and find it
gone: the successor therefore loads every write its predecessor acknowledged. (SQLite has a
single writer, which gives the same order.)

Functions here take a connection and never commit: ``Database.run`` owns the transaction.

``write_many`` is the hot path (``transactions/batcher.py`` hands it every write of a
batch). On PostgreSQL a run of updates goes to the driver as one ``executemany`` of the very
statement ``update`` builds, compiled once from the same Core expression, with ``RETURNING``
so each row reports its own fenced outcome; psycopg pipelines the run into one round trip
and prepares the statement on the connection after a few uses. Building and caching a Core
statement per row costs more CPU than PostgreSQL spends executing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from coordinator_service.db.schema import leases, transactions
from coordinator_service.transactions.state import TxnRecord
from eos_protocol.states import TransactionState

T = transactions


@dataclass(frozen=True)
class LeaseToken:
    """The lease a write is made under: log partition, owner and coordinator epoch."""

    log_partition: int
    owner: str
    coordinator_epoch: int


def lease_held(token: LeaseToken, now_ms: int, *, lock: bool) -> sa.Exists:
    """The EXISTS clause that makes a statement a no-op once the lease has moved on."""
    q = sa.select(sa.literal(1)).where(
        leases.c.log_partition == token.log_partition,
        leases.c.owner == token.owner,
        leases.c.coordinator_epoch == token.coordinator_epoch,
        leases.c.expires_at_ms > now_ms,
    )
    if lock:
        q = q.with_for_update(read=True)
    return sa.exists(q)


def _fenced_update() -> sa.Update:
    """``update``'s statement with every value a named parameter (compiled once)."""
    lease = sa.exists(
        sa.select(sa.literal_column("1"))
        .where(
            leases.c.log_partition == sa.bindparam("lease_partition"),
            leases.c.owner == sa.bindparam("lease_owner"),
            leases.c.coordinator_epoch == sa.bindparam("lease_epoch"),
            leases.c.expires_at_ms > sa.bindparam("lease_now"),
        )
        .with_for_update(read=True)
    )
    columns = [c.name for c in T.c if c.name != "transactional_id"]
    return (
        T.update()
        .where(T.c.transactional_id == sa.bindparam("key_tid"), lease)
        .values({c: sa.bindparam(f"new_{c}") for c in columns})
        .returning(T.c.transactional_id)
    )


FENCED_UPDATE_SQL = str(
    _fenced_update().compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
)


LOCK_LEASES_SQL = str(
    sa.select(leases.c.log_partition)
    .where(leases.c.log_partition == sa.func.any(sa.bindparam("partitions")))
    .order_by(leases.c.log_partition)
    .with_for_update(read=True)
    .compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
)


def _fenced_params(rec: TxnRecord, token: LeaseToken, now_ms: int) -> dict[str, Any]:
    """``FENCED_UPDATE_SQL``'s parameters, spelt out: this runs for every state write."""
    return {
        "key_tid": rec.transactional_id,
        "new_txn_log_partition": rec.txn_log_partition,
        "new_producer_id": rec.producer_id,
        "new_producer_epoch": rec.producer_epoch,
        "new_last_producer_id": rec.last_producer_id,
        "new_last_producer_epoch": rec.last_producer_epoch,
        "new_state": rec.state.value,
        "new_timeout_ms": rec.timeout_ms,
        "new_txn_start_ms": rec.txn_start_ms,
        "new_last_update_ms": rec.last_update_ms,
        "new_partitions": orjson.dumps(rec.partitions).decode(),
        "new_groups": orjson.dumps(rec.groups).decode(),
        "new_coordinator_epoch": rec.coordinator_epoch,
        "new_transaction_version": rec.transaction_version,
        "new_next_producer_id": rec.next_producer_id,
        "lease_partition": token.log_partition,
        "lease_owner": token.owner,
        "lease_epoch": token.coordinator_epoch,
        "lease_now": now_ms,
    }


def _values(rec: TxnRecord) -> dict[str, Any]:
    return {
        "transactional_id": rec.transactional_id,
        "txn_log_partition": rec.txn_log_partition,
        "producer_id": rec.producer_id,
        "producer_epoch": rec.producer_epoch,
        "last_producer_id": rec.last_producer_id,
        "last_producer_epoch": rec.last_producer_epoch,
        "state": rec.state.value,
        "timeout_ms": rec.timeout_ms,
        "txn_start_ms": rec.txn_start_ms,
        "last_update_ms": rec.last_update_ms,
        "partitions": orjson.dumps(rec.partitions).decode(),  # tuples are JSON arrays
        "groups": orjson.dumps(rec.groups).decode(),
        "coordinator_epoch": rec.coordinator_epoch,
        "transaction_version": rec.transaction_version,
        "next_producer_id": rec.next_producer_id,
    }


def record_from_row(row: Any) -> TxnRecord:
    m = row._mapping
    return TxnRecord(
        transactional_id=m["transactional_id"],
        txn_log_partition=m["txn_log_partition"],
        producer_id=m["producer_id"],
        producer_epoch=m["producer_epoch"],
        last_producer_id=m["last_producer_id"],
        last_producer_epoch=m["last_producer_epoch"],
        state=TransactionState(m["state"]),
        timeout_ms=m["timeout_ms"],
        txn_start_ms=m["txn_start_ms"],
        last_update_ms=m["last_update_ms"],
        partitions=tuple((str(t), int(p)) for t, p in orjson.loads(m["partitions"])),
        groups=tuple(str(g) for g in orjson.loads(m["groups"])),
        coordinator_epoch=m["coordinator_epoch"],
        transaction_version=m["transaction_version"],
        next_producer_id=m["next_producer_id"],
    )


class TransactionStore:
    """The transactions table, with every write fenced by a lease."""

    def __init__(self, dialect: str) -> None:
        self._lock = dialect == "postgresql"
        self._postgres = dialect == "postgresql"

    def load_partition(self, conn: Connection, log_partition: int) -> list[TxnRecord]:
        rows = conn.execute(sa.select(T).where(T.c.txn_log_partition == log_partition))
        return [record_from_row(r) for r in rows]

    def get(self, conn: Connection, transactional_id: str) -> TxnRecord | None:
        row = conn.execute(sa.select(T).where(T.c.transactional_id == transactional_id)).first()
        return record_from_row(row) if row is not None else None

    def find_by_producer(self, conn: Connection, producer_id: int) -> TxnRecord | None:
        """The record whose producer id this is, or which hands it out when its ending
        transaction completes (a version-2 rollover)."""
        row = conn.execute(sa.select(T).where(T.c.producer_id == producer_id)).first()
        if row is None:
            row = conn.execute(
                sa.select(T).where(T.c.next_producer_id == producer_id)
            ).first()
        return record_from_row(row) if row is not None else None

    def list_all(self, conn: Connection, state: TransactionState | None) -> list[TxnRecord]:
        q = sa.select(T).order_by(T.c.transactional_id)
        if state is not None:
            q = q.where(T.c.state == state.value)
        return [record_from_row(r) for r in conn.execute(q)]

    def insert(self, conn: Connection, rec: TxnRecord, token: LeaseToken, now_ms: int) -> bool:
        """Insert a new id's record; False when the lease is no longer ours."""
        values = _values(rec)
        cols = list(values)
        src = sa.select(*[sa.literal(values[c], type_=T.c[c].type) for c in cols]).where(
            lease_held(token, now_ms, lock=self._lock)
        )
        statement = T.insert().from_select(cols, src)
        result = conn.execute(statement.execution_options(preserve_rowcount=True))
        return result.rowcount == 1

    def update(self, conn: Connection, rec: TxnRecord, token: LeaseToken, now_ms: int) -> bool:
        """Overwrite the id's record; False when the lease is no longer ours."""
        values = _values(rec)
        del values["transactional_id"]
        result = conn.execute(
            T.update()
            .where(
                T.c.transactional_id == rec.transactional_id,
                lease_held(token, now_ms, lock=self._lock),
            )
            .values(**values)
        )
        return result.rowcount == 1

    def update_many(
        self, conn: Connection, recs: list[tuple[TxnRecord, LeaseToken]], now_ms: int
    ) -> list[bool]:
        """Several fenced updates in one database transaction (one log sync)."""
        return self.write_many(conn, [(rec, token, False) for rec, token in recs], now_ms)

    def write_many(
        self, conn: Connection, writes: list[tuple[TxnRecord, LeaseToken, bool]], now_ms: int
    ) -> list[bool]:
        """Fenced inserts (``True``) and updates (``False``) in order, in the caller's
        transaction; for each, False when its lease is no longer ours."""
        partitions = sorted({token.log_partition for _, token, _ in writes})
        if self._postgres and len(partitions) > 1:
            self._lock_leases(conn, partitions)
        oks: list[bool] = []
        run: list[tuple[TxnRecord, LeaseToken]] = []
        for rec, token, insert in writes:
            if not insert:
                run.append((rec, token))
                continue
            oks.extend(self._update_run(conn, run, now_ms))
            run = []
            oks.append(self.insert(conn, rec, token, now_ms))
        oks.extend(self._update_run(conn, run, now_ms))
        return oks

    @staticmethod
    def _lock_leases(conn: Connection, partitions: list[int]) -> None:
        """Share-lock the lease rows of a batch up front, in ascending order.

        Each fenced statement share-locks its lease row; a batch spanning several log
        partitions would take them in the order of its writes while a renewal (lease
        manager, also ascending) holds some of them exclusively: a deadlock that
        PostgreSQL breaks only after ``deadlock_timeout``. Taking them all first, in the
        renewal's order, leaves no cycle; the fenced statements then find them held.
        """
        with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
            cur.execute(LOCK_LEASES_SQL, {"partitions": partitions})

    def _update_run(
        self, conn: Connection, run: list[tuple[TxnRecord, LeaseToken]], now_ms: int
    ) -> list[bool]:
        if not run:
            return []
        if not self._postgres:  # SQLite: one writer, statements are cheap in-process calls
            return [self.update(conn, rec, token, now_ms) for rec, token in run]
        params = [_fenced_params(rec, token, now_ms) for rec, token in run]
        oks: list[bool] = []
        with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
            cur.executemany(FENCED_UPDATE_SQL, params, returning=True)
            while True:
                oks.append(cur.rowcount == 1)
                if not cur.nextset():
                    break
        if len(oks) != len(run):
            raise RuntimeError(f"{len(run)} updates gave {len(oks)} results")
        return oks

    def delete(self, conn: Connection, rec: TxnRecord, token: LeaseToken, now_ms: int) -> bool:
        """Remove an expired id, only if its record is still the one we decided on."""
        result = conn.execute(
            T.delete().where(
                T.c.transactional_id == rec.transactional_id,
                T.c.last_update_ms == rec.last_update_ms,
                lease_held(token, now_ms, lock=self._lock),
            )
        )
        return result.rowcount == 1
