"""Timeouts and expiry driven by a fake clock: no sleeping, the scan is run by hand."""

from __future__ import annotations

from typing import Any

from coordinator_service.clock import FakeClock
from tests.coordinator.helpers import add, code, describe, end, init, ok, topic
from tests.support.coordinators import FakeNodes
from tests.support.processes import wait_until

DAY_MS = 86_400_000


def _start(factory: Any, clock: FakeClock, **overrides: Any) -> Any:
    return factory(clock=clock, background=False, lease_ms=600_000, **overrides)


def test_timed_out_transaction_is_fenced_and_aborted(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    clock = FakeClock()
    coordinator = _start(coordinator_factory, clock)
    scan = coordinator.services.expiry.run_once
    with coordinator.client() as c:
        topic(c)
        pid, epoch = init(c, "slow", transaction_timeout_ms=1000)
        ok(add(c, "slow", pid, epoch, 0, 3))
        clock.advance(1000)
        assert coordinator.call(scan).aborted == 0
        assert describe(c, "slow")["state"] == "Ongoing"
        clock.advance(1)
        assert coordinator.call(scan).aborted == 1
        wait_until(lambda: describe(c, "slow")["state"] == "CompleteAbort", timeout=10,
                   what="timeout abort to complete")
        assert describe(c, "slow")["producer_epoch"] == epoch + 1
        aborts = [m for _n, m in fake_nodes.markers_for(pid) if m["result"] == "ABORT"]
        assert {tp["partition"] for m in aborts for tp in m["partitions"]} == {0, 3}
        assert all(m["producer_epoch"] == epoch + 1 for m in aborts)
        # The zombie finds out on its next call.
        assert code(end(c, "slow", pid, epoch)) == "PRODUCER_FENCED"
        assert code(add(c, "slow", pid, epoch, 1)) == "PRODUCER_FENCED"
        metrics = c.get("/metrics").text
        assert "eos_coordinator_timeouts_total 1.0" in metrics


def test_transactional_ids_idle_past_expiration_are_removed(
    coordinator_factory: Any,
) -> None:
    clock = FakeClock()
    coordinator = _start(coordinator_factory, clock, transactional_id_expiration_ms=7 * DAY_MS)
    scan = coordinator.services.expiry.run_once
    with coordinator.client() as c:
        topic(c)
        init(c, "idle")
        pid, epoch = init(c, "done")
        ok(add(c, "done", pid, epoch, 1))
        ok(end(c, "done", pid, epoch))
        clock.advance(6 * DAY_MS)
        pid3, epoch3 = init(c, "busy", transaction_timeout_ms=900_000)
        ok(add(c, "busy", pid3, epoch3, 2))
        assert coordinator.call(scan).expired == 0
        clock.advance(DAY_MS + 1)
        result = coordinator.call(scan)
        assert result.expired == 2
        assert code(c.get("/v1/transactions/idle")) == "TRANSACTIONAL_ID_NOT_FOUND"
        assert code(c.get("/v1/transactions/done")) == "TRANSACTIONAL_ID_NOT_FOUND"
        # The Ongoing one timed out instead of expiring (its own timeout is 15 minutes).
        assert result.aborted == 1
        # An expired id starts again from scratch.
        _pid4, epoch4 = init(c, "idle")
        assert epoch4 == 0


def test_prepare_left_behind_is_resumed_by_the_scan(
    coordinator_factory: Any, fake_nodes: FakeNodes
) -> None:
    clock = FakeClock()
    coordinator = _start(coordinator_factory, clock)
    services = coordinator.services
    with coordinator.client() as c:
        topic(c)
        pid, epoch = init(c, "left")
        ok(add(c, "left", pid, epoch, 0, 1))
        fake_nodes.down.update({1, 2})
        ok(end(c, "left", pid, epoch, wait=False))
        partition = services.coordinator.partition_of("left")

        async def forget() -> None:
            services.markers.abandon(partition)

        coordinator.call(forget)
        fake_nodes.down.clear()
        assert coordinator.call(services.expiry.run_once).resumed == 1
        wait_until(lambda: describe(c, "left")["state"] == "CompleteCommit", timeout=10,
                   what="resumed markers")
