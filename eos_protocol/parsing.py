"""Parsing the wire's payloads in bulk, the same way on both sides of it.

A fetch answer or a produce request carries thousands of records; the SDK parses the
first and the storage node the second, each making a burst of objects that are freed (or
left acyclic) soon after. Both pause the cyclic garbage collector around such a burst.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around a burst of allocations that are freed
    (or left acyclic) before it resumes, such as the thousand record models of a parsed
    batch. A collection in the middle of the burst would promote them all as long-lived,
    and the full collections of the whole heap that follow cost more than the parse."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
