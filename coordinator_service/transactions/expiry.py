"""The background scan for timed-out transactions and expired transactional ids.

Every ``expiry_scan_interval_ms`` (10 s, Kafka's default) the scan walks the records of the
log partitions this instance owns and, reading time from the injected clock:

* aborts Ongoing transactions older than their timeout — the coordinator bumps the epoch
  first, so the abort markers fence the zombie producer on every partition;
* re-queues the markers of Prepare* transactions that have none in flight (left behind by
  an earlier owner or a lost node answer);
* removes ids idle past ``transactional.id.expiration.ms`` whose state allows it.

``run_once`` is what tests call after moving a ``FakeClock``; ``run_forever`` is the loop.

Each record is handled on its own: one that fails (a row the database refuses to change, a
bug on one record's data) is logged, counted (``eos_coordinator_background_entries_set_aside``
with ``loop="expiry"``) and left for the next scan, and the scan goes on with the others —
a failure used to end the scan, so every record after it was never timed out or expired.
A lost lease is not a failure: the new owner scans those records.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from coordinator_service.clock import Clock
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions import state as st
from coordinator_service.transactions.lifecycle import TransactionCoordinator
from eos_protocol.errors import EosError

log = logging.getLogger("eos.coordinator.expiry")

#: Failed records of one scan logged one by one (the rest are counted in the summary).
LOGGED_FAILURES = 10


@dataclass
class ScanResult:
    aborted: int = 0
    resumed: int = 0
    expired: int = 0
    failed: int = 0


class ExpiryScanner:
    def __init__(
        self,
        coordinator: TransactionCoordinator,
        *,
        clock: Clock,
        interval_ms: int,
        expiration_ms: int,
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._metrics = metrics or CoordinatorMetrics()
        self._clock = clock
        self._interval_s = interval_ms / 1000
        self._expiration_ms = expiration_ms

    async def run_once(self) -> ScanResult:
        now = self._clock.now_ms()
        result = ScanResult()
        for records in list(self._coordinator.cache.values()):
            for rec in list(records.values()):
                try:
                    if st.is_timed_out(rec, now):
                        if await self._coordinator.abort_timed_out(rec.transactional_id, now):
                            result.aborted += 1
                    elif rec.state.is_prepare:
                        job = self._coordinator.markers.jobs.get(rec.transactional_id)
                        if job is None and self._coordinator.ensure_markers(rec) is not None:
                            result.resumed += 1
                    elif st.is_expired(rec, now, self._expiration_ms) and (
                        await self._coordinator.expire(
                            rec.transactional_id, now, self._expiration_ms
                        )
                    ):
                        result.expired += 1
                except EosError as exc:  # lease lost meanwhile: the new owner will scan
                    log.info("scan skipped %r: %s", rec.transactional_id, exc)
                except Exception:
                    result.failed += 1
                    self._metrics.set_aside.labels(loop="expiry").inc()
                    if result.failed <= LOGGED_FAILURES:  # a database outage fails them all
                        log.error(
                            "expiry scan failed on %r (state %s); going on with the others",
                            rec.transactional_id, rec.state.value,
                            exc_info=result.failed == 1,
                            extra={"transactional_id": rec.transactional_id},
                        )
        if result.failed:
            log.warning("expiry scan: %d records failed and wait for the next scan",
                        result.failed)
        return result

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.run_once()
            except Exception:
                log.exception("expiry scan failed")
