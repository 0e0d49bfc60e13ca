"""Where the transaction-log leases are in a cluster of real coordinator processes.

Coordinators share the log partitions evenly and move them when one joins or leaves, so
a test that needs a transactional id owned by one particular instance first waits until
the shares have settled, then picks an id that instance owns."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import httpx

from tests.support.processes import wait_until


class Addressed(Protocol):
    """A coordinator as these helpers need it: where it answers."""

    @property
    def url(self) -> str: ...

OWNED = re.compile(r"^eos_coordinator_owned_log_partitions (\S+)$", re.MULTILINE)


def owned_partitions(coordinator: Addressed) -> int:
    """The instance's own count of the log partitions it holds (-1 if it cannot say)."""
    try:
        text = httpx.get(f"{coordinator.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return -1
    found = OWNED.search(text)
    return int(float(found.group(1))) if found else -1


def wait_balanced(
    coordinators: Sequence[Addressed], partitions: int = 50, timeout: float = 30
) -> list[int]:
    """Wait until the live ``coordinators`` hold every log partition between them, each
    its fair share (equal, give or take one); their counts."""
    n = len(coordinators)
    low, high = partitions // n, -(-partitions // n)

    seen: list[int] = []

    def settled() -> bool:
        seen[:] = [owned_partitions(c) for c in coordinators]
        return sum(seen) == partitions and all(low <= c <= high for c in seen)

    wait_until(settled, timeout=timeout, what=f"leases balanced over {n}: {seen}")
    return seen


def owner_url(any_coordinator: str, tid: str) -> str | None:
    answer = httpx.get(f"{any_coordinator}/v1/coordinators", params={"key": tid}, timeout=5)
    return str(answer.json()["url"]).rstrip("/") if answer.status_code == 200 else None


def tid_owned_by(coordinator: Addressed, prefix: str, tries: int = 200) -> str:
    """A transactional id whose log partition ``coordinator`` owns now."""
    for i in range(tries):
        tid = f"{prefix}-{i}"
        if owner_url(coordinator.url, tid) == coordinator.url.rstrip("/"):
            return tid
    raise AssertionError(f"{coordinator.url} owns none of {tries} ids")
