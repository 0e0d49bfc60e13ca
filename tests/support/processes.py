"""Service processes for the tests are the product's own launcher's (``eos_cli.launcher``),
the one ``eos up`` and the benchmarks start services with; here it is re-exported next
to ``wait_until``, the polling every test waits with instead of sleeping."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterable

from eos_cli.launcher import ServiceError, ServiceProcess, free_port, port_range

__all__ = ["ServiceError", "ServiceProcess", "free_port", "free_port_base", "wait_until"]


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``condition`` until it holds; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def free_port_base(offsets: Iterable[int] = (0, 1, 11, 12, 13)) -> int:
    """A port base (a multiple of 100 in ``port_range()``) whose ``eos up`` ports
    (the coordinators from the base, node N at base + 10 + N) nobody listens on, for the
    tests that start ``eos up`` or ``eos demo`` while other tests run beside them."""
    wanted = tuple(offsets)
    low, high = port_range()
    while True:
        base = random.randrange(-(-low // 100) * 100, high - max(wanted), 100)
        if all(_port_free(base + offset) for offset in wanted):
            return base
