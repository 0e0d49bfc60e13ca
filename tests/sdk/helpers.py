"""Reading topics back to check what the producers wrote."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sdk import Consumer, ConsumerRecord


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def read_topic(url: str, topic: str, partitions: int, *, expect: int | None = None,
               isolation_level: str = "read_committed", timeout: float = 20.0,
               settle: float = 0.3) -> list[ConsumerRecord]:
    """Every record of ``topic`` visible at ``isolation_level``. With ``expect`` it polls
    until that many arrived (or the deadline); otherwise until a poll of ``settle``
    seconds brings nothing new."""
    with Consumer(url, isolation_level=isolation_level) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout=settle)
            records.extend(batch)
            if expect is not None and len(records) >= expect:
                break
            if expect is None and not batch:
                break
        return records


def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition()`` until it returns something truthy; that value is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def values(records: list[ConsumerRecord]) -> list[Any]:
    return [r.value for r in records]
