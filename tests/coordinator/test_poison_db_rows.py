"""One poisoned database row must not stall a coordinator background loop.

Each test plants one row the loop cannot handle — a transaction PostgreSQL refuses to
expire, abort or complete (a trigger stands for whatever makes a write of that row fail),
an ACL binding that does not read, a transaction record that does not load — next to
healthy ones, and shows that the healthy ones still progress, that the poisoned one is
reported, and that it is picked up once it is fixed. Everything runs on a real PostgreSQL
database migrated by Alembic.
"""

from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa

from coordinator_service.clock import FakeClock
from eos_protocol.acl import Operation, ResourceType
from tests.coordinator.helpers import add, code, describe, end, init, ok, topic
from tests.support.processes import wait_until

DAY_MS = 86_400_000

POISON_TRIGGER = """
CREATE TABLE poisoned (tid text NOT NULL, op text NOT NULL, state_like text NOT NULL);
CREATE FUNCTION refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    IF EXISTS (SELECT 1 FROM poisoned WHERE tid = OLD.transactional_id AND op = 'DELETE') THEN
      RAISE EXCEPTION 'poisoned row %', OLD.transactional_id;
    END IF;
    RETURN OLD;
  END IF;
  IF EXISTS (SELECT 1 FROM poisoned WHERE tid = OLD.transactional_id AND op = 'UPDATE'
             AND NEW.state LIKE state_like) THEN
    RAISE EXCEPTION 'poisoned row %', OLD.transactional_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_poisoned BEFORE UPDATE OR DELETE ON transactions
  FOR EACH ROW EXECUTE FUNCTION refuse_poisoned();
"""


def sql(engine: sa.Engine, statement: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def poison(engine: sa.Engine, tid: str, op: str, state_like: str = "%") -> None:
    """From now on PostgreSQL refuses ``op`` (UPDATE to a state LIKE ``state_like``, or
    DELETE) on the row of ``tid``."""
    with engine.begin() as conn:
        exists = conn.execute(sa.text("SELECT to_regclass('poisoned')")).scalar()
        if exists is None:
            conn.execute(sa.text(POISON_TRIGGER))
        conn.execute(sa.text("INSERT INTO poisoned VALUES (:t, :o, :s)"),
                     {"t": tid, "o": op, "s": state_like})


def cure(engine: sa.Engine) -> None:
    sql(engine, "DELETE FROM poisoned")


def metric(client: httpx.Client, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start!r}")


def set_aside(client: httpx.Client, loop: str) -> float:
    return metric(client, f'eos_coordinator_background_entries_set_aside_total{{loop="{loop}"}}')


# --- the expiry scan ---------------------------------------------------------------------


def test_a_record_that_fails_to_expire_or_abort_does_not_end_the_scan(
    coordinator_factory: Any, db: sa.Engine
) -> None:
    clock = FakeClock()
    coordinator = coordinator_factory(clock=clock, background=False, lease_ms=600_000,
                                      transactional_id_expiration_ms=DAY_MS)
    services = coordinator.services
    with coordinator.client() as c:
        topic(c)
        idle = [f"idle-{i}" for i in range(12)]
        for tid in idle:
            init(c, tid)
        slow = [f"slow-{i}" for i in range(4)]
        for tid in slow:
            pid, epoch = init(c, tid, transaction_timeout_ms=1000)
            ok(add(c, tid, pid, epoch, 0))
        # poison the first record of each kind the scan comes to
        order = [tid for records in services.coordinator.cache.values() for tid in records]
        bad_idle = next(t for t in order if t in idle)
        bad_slow = next(t for t in order if t in slow)
        poison(db, bad_idle, "DELETE")
        poison(db, bad_slow, "UPDATE", "Prepare%")
        clock.advance(DAY_MS + 1)

        result = coordinator.call(services.expiry.run_once)
        assert (result.expired, result.aborted, result.failed) == (11, 3, 2)
        for tid in idle:
            if tid != bad_idle:
                assert code(c.get(f"/v1/transactions/{tid}")) == "TRANSACTIONAL_ID_NOT_FOUND"
        assert describe(c, bad_idle)["state"] == "Empty"
        assert describe(c, bad_slow)["state"] == "Ongoing"
        wait_until(lambda: all(describe(c, t)["state"] == "CompleteAbort"
                               for t in slow if t != bad_slow),
                   timeout=10, what="the other timed-out transactions to be aborted")
        assert set_aside(c, "expiry") == 2

        cure(db)
        result = coordinator.call(services.expiry.run_once)
        assert (result.expired, result.aborted, result.failed) == (1, 1, 0)
        assert code(c.get(f"/v1/transactions/{bad_idle}")) == "TRANSACTIONAL_ID_NOT_FOUND"


# --- the marker channel's completion writer ----------------------------------------------


def test_a_transaction_whose_completion_cannot_be_written_holds_back_no_other(
    coordinator: Any, db: sa.Engine
) -> None:
    with coordinator.client(timeout=15) as c:
        topic(c)
        pid, epoch = init(c, "doomed")
        ok(add(c, "doomed", pid, epoch, 0, 1))
        poison(db, "doomed", "UPDATE", "Complete%")
        assert ok(end(c, "doomed", pid, epoch, wait=False))["state"] == "PrepareCommit"
        for i in range(5):
            tid = f"fine-{i}"
            pid_i, epoch_i = init(c, tid)
            ok(add(c, tid, pid_i, epoch_i, 0, 1, 2))
            assert ok(end(c, tid, pid_i, epoch_i))["state"] == "CompleteCommit"
        assert describe(c, "doomed")["state"] == "PrepareCommit"
        wait_until(lambda: set_aside(c, "markers") >= 2, timeout=10,
                   what="the doomed completion to be tried alone again")
        cure(db)
        wait_until(lambda: describe(c, "doomed")["state"] == "CompleteCommit", timeout=15,
                   what="the doomed transaction to complete once its row can be written")


# --- the ACL refresh ---------------------------------------------------------------------

ACL_INSERT = (
    "INSERT INTO acls (principal, resource_type, resource_name, pattern_type, operation, "
    "permission, created_ms) VALUES (:principal, :rtype, :name, :pattern, :op, :perm, 0)"
)


def acl(engine: sa.Engine, principal: str, rtype: str, name: str, op: str, perm: str,
        pattern: str = "literal") -> None:
    sql(engine, ACL_INSERT, principal=principal, rtype=rtype, name=name, pattern=pattern,
        op=op, perm=perm)


def test_one_unreadable_acl_row_does_not_stop_the_refresh(
    coordinator_factory: Any, db: sa.Engine
) -> None:
    coordinator = coordinator_factory(acl_refresh_ms=100)
    authorizer = coordinator.services.access.authorizer
    acl(db, "User:a", "topic", "orders", "fly", "allow")  # no such operation
    acl(db, "User:b", "queue", "orders", "read", "deny")  # no such resource type
    acl(db, "User:b", "topic", "orders", "read", "allow")
    acl(db, "User:c", "topic", "orders", "write", "allow")

    wait_until(lambda: authorizer.allowed("User:c", ResourceType.TOPIC, "orders",
                                          Operation.WRITE),
               timeout=10, what="the readable grant to be read despite the unreadable rows")
    # failing closed: the unreadable allow grants nothing, the unreadable deny is widened
    assert not authorizer.allowed("User:a", ResourceType.TOPIC, "orders", Operation.READ)
    assert not authorizer.allowed("User:b", ResourceType.TOPIC, "orders", Operation.READ)
    snapshot = coordinator.call(coordinator.services.acl_rules.fresh_snapshot)
    principals = {(b.principal, b.permission.value) for b in snapshot.acls}
    assert principals == {("User:b", "deny"), ("User:b", "allow"), ("User:c", "allow")}
    with coordinator.client() as c:
        wait_until(lambda: set_aside(c, "acls") == 2, timeout=10, what="both rows reported")
        coordinator.call(coordinator.services.acl_rules.reload)
        assert set_aside(c, "acls") == 2  # reported once, not at every refresh

    # an instance starting with the rows there starts, and reads the rules the same way
    other = coordinator_factory()
    assert other.services.access.authorizer.allowed(
        "User:c", ResourceType.TOPIC, "orders", Operation.WRITE)
    sql(db, "DELETE FROM acls WHERE resource_type = 'queue'")
    wait_until(lambda: authorizer.allowed("User:b", ResourceType.TOPIC, "orders",
                                          Operation.READ),
               timeout=10, what="the deny to end with its row")


# --- the lease round ---------------------------------------------------------------------


def test_a_log_partition_that_cannot_be_loaded_holds_back_no_other(
    coordinator_factory: Any, db: sa.Engine
) -> None:
    first = coordinator_factory(background=False)
    with first.client() as c:
        tids = [f"tid-{i}" for i in range(30)]
        for tid in tids:
            init(c, tid)
        partition_of = {tid: first.services.coordinator.partition_of(tid) for tid in tids}
    first.stop()  # releases its leases
    bad = min(tids, key=lambda t: partition_of[t])  # loaded first: the others come after it
    sql(db, "UPDATE transactions SET partitions = 'not json' WHERE transactional_id = :t",
        t=bad)

    lease_clock = FakeClock()
    second = coordinator_factory(background=False, lease_clock=lease_clock, lease_ms=10_000)
    leases = second.services.leases
    assert sorted(leases.owned) == [p for p in range(50) if p != partition_of[bad]]
    with second.client() as c:
        for tid in tids:
            if partition_of[tid] != partition_of[bad]:
                assert init(c, tid)[1] == 1, tid
        refused = c.post(f"/v1/transactions/{bad}/init", json={})
        assert refused.status_code == 503
        assert refused.json()["error"] == {
            "code": "COORDINATOR_NOT_AVAILABLE", "retriable": True,
            "message": refused.json()["error"]["message"]}
        assert set_aside(c, "leases") == 1

        sql(db, "UPDATE transactions SET partitions = '[]' WHERE transactional_id = :t", t=bad)
        lease_clock.advance(10_001)  # its lease ran out unrenewed: taken and loaded again
        second.call(leases.run_round)
        assert len(leases.owned) == 50
        assert init(c, bad)[1] == 1
