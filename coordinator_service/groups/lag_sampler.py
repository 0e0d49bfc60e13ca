"""Each coordinated group's total lag, read from the storage nodes in the background.

``eos_coordinator_group_lag{group}`` is the sum over a group's partitions of last stable
offset - committed offset (from 0 where nothing is committed), the same numbers
``GET /v1/groups/{id}`` answers per partition. They live on the storage nodes, and a
Prometheus scrape must answer from memory (a node that hangs would hang ``/metrics``, the
one page that should show it), so a loop reads them every ``group_lag_interval_ms``
(30 s by default) and the scrape reads the gauge.

Which groups: the ones this instance coordinates (holds the lease of) and that are on
record, as ``eos_coordinator_groups`` counts them. A group whose lease moved away loses its
series here; its new coordinator samples it from then on, so summing the series over
instances never counts a group twice for long.

What a round costs: one committed-offsets call per group (to the node leading the group's
``__consumer_offsets`` partition), at most ``GROUPS_AT_ONCE`` at a time, then one
last-stable-offset call per partition that any group reads, asked once however many
groups read it, at most ``PARTITIONS_AT_ONCE`` at a time. Rounds never overlap: the next
one starts an interval after the last ended, however slow a node was.

Failures: a group whose lag cannot be summed — its offsets node away or refusing, or any
of its partitions without an answer from its leader — **drops its series** until a sample
succeeds again. A frozen last value would look like a steady, healthy lag while the group
may be falling behind, and a sum without the unanswered partitions would understate it; a
gap is how Prometheus says "unknown", and ``absent()`` can alert on it. Each group is
logged once when its lag becomes unknown (with why) and once when it is known again, not at
every round. One group failing never stops the others.

Authentication: the nodes judge every offsets call by the caller's token (read on the
group, describe on the topic), and this loop has no caller. The coordinator's internal
token opens only the nodes' ``/internal`` routes, and giving it rights on their public
ones would make every coordinator a super user there; so with token authentication on the
loop is not started (``app.py``), and the lag is read with each caller's own token through
``GET /v1/groups/{id}`` and the console's group page instead. Clusters without
authentication get the gauge.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

from coordinator_service.groups.coordinator import GroupCoordinator
from coordinator_service.groups.membership import Group
from coordinator_service.groups.offsets import GroupOffsets
from coordinator_service.metrics import CoordinatorMetrics
from eos_protocol.errors import EosError

log = logging.getLogger("eos.coordinator.groups.lag")

#: Groups whose committed offsets are asked for at once.
GROUPS_AT_ONCE = 4
#: Partitions whose last stable offset is asked for at once.
PARTITIONS_AT_ONCE = 8

T = TypeVar("T")
Key = tuple[str, int]
#: Headers of the loop's calls: none (it runs only where the nodes ask for no token).
NO_CREDENTIALS: dict[str, str] = {}


def coordinated_groups(groups: GroupCoordinator) -> list[Group]:
    """The groups this instance coordinates that are on record. ``GroupCoordinator.owned``
    also keeps an empty stand-in (group epoch 0) for an id nobody has joined — a heartbeat
    naming a member of a group that does not exist, an offsets reset of a group never
    joined — which is no group to count or sample."""
    return [g for g in groups.coordinated() if g.group_epoch > 0]


def subscribed_partitions(group: Group) -> frozenset[Key]:
    """Every partition of the topics the group's targets were computed for."""
    return frozenset((t, p) for t, n in group.subscribed_metadata.items() for p in range(n))


class LagUnknown(Exception):
    """A group's lag could not be summed; the message says why."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EosError | httpx.HTTPError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class LagSampler:
    """Samples ``eos_coordinator_group_lag`` for the groups this instance coordinates."""

    def __init__(
        self,
        groups: GroupCoordinator,
        offsets: GroupOffsets,
        metrics: CoordinatorMetrics,
        *,
        interval_ms: int,
    ) -> None:
        self._groups = groups
        self._offsets = offsets
        self._metrics = metrics
        self.interval_ms = interval_ms
        self._shown: set[str] = set()  # groups with a series now
        self._unknown: dict[str, str] = {}  # groups whose lag is unknown: why (logged once)

    async def sample_once(self) -> dict[str, int]:
        """One round over every coordinated group: the lags set, by group id."""
        wanted = {g.group_id: subscribed_partitions(g) for g in coordinated_groups(self._groups)}
        for gone in self._shown - wanted.keys():
            self._drop(gone)
        for gone in self._unknown.keys() - wanted.keys():
            del self._unknown[gone]
        ids = sorted(wanted)
        committed = await _bounded(
            GROUPS_AT_ONCE, [functools.partial(self._committed, gid) for gid in ids]
        )
        keys: set[Key] = set()
        for gid, done in zip(ids, committed, strict=True):
            if not isinstance(done, LagUnknown):
                keys |= wanted[gid] | done.keys()
        asked = sorted(keys)
        stable = dict(zip(asked, await _bounded(
            PARTITIONS_AT_ONCE, [functools.partial(self._stable, key) for key in asked]
        ), strict=True))  # fmt: skip
        sampled: dict[str, int] = {}
        for gid, done in zip(ids, committed, strict=True):
            lag = done if isinstance(done, LagUnknown) else _total(
                wanted[gid] | done.keys(), done, stable
            )
            if isinstance(lag, LagUnknown):
                self._lost(gid, str(lag))
            else:
                sampled[gid] = lag
                self._set(gid, lag)
        return sampled

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.sample_once()
            except Exception:  # a bug, not a node: logged, and the next round tries again
                log.exception("group lag sampling failed")

    async def _committed(self, group_id: str) -> dict[Key, int] | LagUnknown:
        try:
            return await self._offsets.committed(group_id, NO_CREDENTIALS)
        except Exception as exc:  # one group's failure is that group's alone
            return LagUnknown(f"its committed offsets could not be read: {_reason(exc)}")

    async def _stable(self, key: Key) -> int | LagUnknown:
        try:
            bounds = await self._offsets.bounds(key[0], key[1], NO_CREDENTIALS)
        except Exception as exc:
            return LagUnknown(f"{key[0]}/{key[1]}: no last stable offset: {_reason(exc)}")
        return bounds["last_stable_offset"]

    def _set(self, group_id: str, lag: int) -> None:
        self._metrics.group_lag.labels(group=group_id).set(lag)
        self._shown.add(group_id)
        if self._unknown.pop(group_id, None) is not None:
            log.info("group %s: lag sampled again (%d)", group_id, lag)

    def _lost(self, group_id: str, why: str) -> None:
        self._drop(group_id)
        if group_id not in self._unknown:
            log.warning("group %s: lag unknown, its eos_coordinator_group_lag series is left "
                        "out until a sample succeeds: %s", group_id, why)
        self._unknown[group_id] = why

    def _drop(self, group_id: str) -> None:
        if group_id in self._shown:
            self._metrics.group_lag.remove(group_id)
            self._shown.discard(group_id)


def _total(keys: frozenset[Key], committed: dict[Key, int],
           stable: dict[Key, int | LagUnknown]) -> int | LagUnknown:
    """The group's lag summed over ``keys``, each partition counted as ``GroupOffsets.lag``
    counts it; the first partition without an answer rather than a partial sum."""
    total = 0
    for key in sorted(keys):
        lso = stable[key]
        if isinstance(lso, LagUnknown):
            return lso
        total += max(0, lso - committed.get(key, 0))
    return total


async def _bounded(limit: int, calls: list[Callable[[], Awaitable[T]]]) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(run(c) for c in calls)))
