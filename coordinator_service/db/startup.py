"""Waiting for the database at start-up.

Services in a deployment start in any order: compose without health conditions, a
Kubernetes pod beside its database, a host rebooting. A coordinator that finds PostgreSQL
not yet accepting connections waits for it, saying so in one line per attempt, instead of
dying with a driver traceback and relying on a restart policy; after
``--database-wait-ms`` it gives up with one line naming the database (password hidden)
and the driver's reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from coordinator_service.db.engine import is_sqlite, make_engine

log = logging.getLogger("eos.coordinator.db")

FIRST_DELAY_S = 0.25
MAX_DELAY_S = 5.0


class DatabaseUnreachable(Exception):
    """The database did not accept a connection within the wait."""


def describe(url: str) -> str:
    """The URL with its password hidden, for log lines."""
    return make_url(url).render_as_string(hide_password=True)


def reason(exc: BaseException) -> str:
    """The first line of the driver's error: what a person needs, not the stack."""
    cause = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[0] if lines else type(cause).__name__


def wait_for_database(
    url: str,
    wait_ms: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Return once ``url`` answers ``SELECT 1``; the number of failed attempts before.

    Raises DatabaseUnreachable when ``wait_ms`` passes first. SQLite needs no wait.
    """
    if is_sqlite(url):
        return 0
    engine = make_engine(url, pool_size=1)
    deadline = clock() + wait_ms / 1000
    delay = FIRST_DELAY_S
    failures = 0
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                if failures:
                    log.info("database %s is reachable", describe(url))
                return failures
            except sa.exc.OperationalError as exc:
                failures += 1
                remaining = deadline - clock()
                if remaining <= 0:
                    raise DatabaseUnreachable(
                        f"database {describe(url)} not reachable within {wait_ms} ms "
                        f"({failures} attempts): {reason(exc)}"
                    ) from None
                pause = min(delay, remaining)
                log.warning(
                    "database %s not reachable yet (%s); trying again in %.2f s",
                    describe(url),
                    reason(exc),
                    pause,
                )
                sleep(pause)
                delay = min(delay * 2, MAX_DELAY_S)
    finally:
        engine.dispose()
