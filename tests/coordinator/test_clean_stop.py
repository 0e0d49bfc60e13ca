"""A clean stop releases the transaction-log leases even when an earlier step of the stop
fails (a marker task that died of an error re-raises it when the stop awaits it): the
next owner takes the partitions at once instead of waiting out the lease time."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.coordinator.conftest import CoordinatorFactory
from tests.support.processes import wait_until


def live_leases(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM leases WHERE log_partition >= 0 AND expires_at_ms > 0"
            )).scalar_one())  # fmt: skip
    finally:
        engine.dispose()


def test_the_leases_are_released_when_stopping_the_markers_fails(
    coordinator_factory: CoordinatorFactory, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = coordinator_factory(txn_log_partitions=6)
    wait_until(lambda: live_leases(pg_url) == 6, timeout=30, what="the six leases taken")

    async def broken_stop() -> None:
        raise RuntimeError("a marker task died of this")

    coordinator.services.markers.stop = broken_stop  # type: ignore[method-assign]
    coordinator.stop()
    assert not coordinator.thread.is_alive()
    assert live_leases(pg_url) == 0, "a clean stop releases every lease"
    assert "stopping: markers failed" in caplog.text
