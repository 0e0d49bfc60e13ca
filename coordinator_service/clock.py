"""Clocks in milliseconds, injected so timeouts and expiry can be tested without sleeping.

The coordinator reads time only through a ``Clock``. Production uses ``SystemClock``; tests
hand a ``FakeClock`` to ``create_app`` and move it forward by hand.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""
        ...


class SystemClock:
    """Wall-clock time; several instances on one machine agree on it (lease expiry)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms

    def set(self, ms: int) -> None:
        with self._lock:
            self._now = ms
