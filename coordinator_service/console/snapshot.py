"""What the console shows, gathered for one page view.

Each page asks for its own part of the picture: the cluster page reads the coordinator
instances, the lease rows and the storage nodes' health; the topics pages the partitions,
their offsets and their producers (``topics.py``, one request per storage node); the
transactions page the coordinator's records and the hanging-transaction report.
Everything is read as the caller: lists are filtered by the same ACLs as the API, and the
storage nodes are asked with the caller's own token, so the console shows nothing its user
could not read with ``curl``.

A storage node that is down must not take the page with it: every node is asked
concurrently, each with a short timeout (``NODE_TIMEOUT_S``), and a failed answer becomes
an ``error`` on the row that needed it instead of an exception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.db.schema import coordinator_instances, leases, node_heartbeats
from coordinator_service.services import Services
from coordinator_service.transactions.state import TxnRecord
from eos_protocol.acl import CLUSTER_RESOURCE, Operation, ResourceType
from eos_protocol.states import TransactionState

#: How long a page waits for any one storage node: a node slower than this is shown as
#: down rather than holding the page (and the live refresh) back.
NODE_TIMEOUT_S = 1.5
#: Requests one page view has in flight to the storage nodes at once: the console shares
#: the coordinator's HTTP client (and its connection pool) with the marker channel.
NODE_CONCURRENCY = 16
#: How many ended transactions the transactions page lists, the most recent first.
RECENT_ENDED = 50
#: Instances silent for longer than this many lease times are left off the page (an
#: instance id names one process's life, so a long-running cluster collects many rows).
FORGET_AFTER_LEASES = 10


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the principal (None when authentication is off) and the token to
    present to the storage nodes on their behalf."""

    principal: str | None
    token: str | None

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


@dataclass(frozen=True)
class CoordinatorRow:
    node_id: int
    instance_id: str
    url: str
    heartbeat_age_ms: int | None
    alive: bool
    is_self: bool
    log_partitions: tuple[int, ...]


@dataclass(frozen=True)
class LeaseRow:
    log_partition: int  # -1: the controller's lease
    owner: str | None
    owner_node_id: int | None
    coordinator_epoch: int
    expires_in_ms: int  # negative: expired that long ago

    @property
    def alive(self) -> bool:
        return self.owner is not None and self.expires_in_ms > 0


@dataclass(frozen=True)
class NodeRow:
    node_id: int
    url: str
    status: str  # "ready", what a node that is not ready answered, or "down"
    latency_ms: int | None
    heartbeat_age_ms: int | None
    error: str | None

    @property
    def up(self) -> bool:
        return self.status == "ready"


@dataclass(frozen=True)
class TransactionRow:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    age_ms: int | None  # how long the open transaction has run; None when none is open
    since_update_ms: int
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...]
    is_open: bool


@dataclass(frozen=True)
class HangingRow:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_offset: int
    age_ms: int
    reason: str
    transactional_id: str | None
    coordinator_state: str | None


@dataclass(frozen=True)
class HangingReport:
    """The hanging-transaction report, or why there is none (``error``)."""

    checked_at_ms: int | None
    open_on_nodes: int | None
    rows: tuple[HangingRow, ...]
    error: str | None


async def ask(
    limit: asyncio.Semaphore, call: Callable[[], Awaitable[httpx.Response]]
) -> tuple[httpx.Response | None, str | None, int]:
    """One node request: the answer or why there is none, and how long it took (the
    request is made only once a place under ``limit`` is free)."""
    async with limit:
        started = time.monotonic()
        try:
            answer = await call()
        except httpx.TimeoutException:
            return None, "no answer in time", _elapsed_ms(started)
        except httpx.HTTPError as exc:
            return None, f"unreachable ({type(exc).__name__})", _elapsed_ms(started)
        return answer, None, _elapsed_ms(started)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def refusal_of(answer: httpx.Response) -> str:
    """The error envelope's message, or the bare status when the body is not one."""
    try:
        error = answer.json()["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {answer.status_code}"


# --- the cluster page ----------------------------------------------------------------------


def _read_cluster(
    conn: Connection, now_ms: int, forget_before_ms: int
) -> tuple[list[sa.Row[Any]], list[sa.Row[Any]], list[sa.Row[Any]]]:
    instances = conn.execute(
        sa.select(coordinator_instances)
        .where(coordinator_instances.c.heartbeat_ms >= forget_before_ms)
        .order_by(coordinator_instances.c.id)
    ).all()
    lease_rows = conn.execute(sa.select(leases).order_by(leases.c.log_partition)).all()
    beats = conn.execute(sa.select(node_heartbeats)).all()
    return list(instances), list(lease_rows), list(beats)


def may_describe_cluster(services: Services, viewer: Viewer) -> bool:
    return services.access.allowed(
        viewer.principal, ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.DESCRIBE
    )


def may_alter_cluster(services: Services, viewer: Viewer) -> bool:
    """Whether the abort buttons are shown (the POST checks again, with a fresh read)."""
    return services.access.allowed(
        viewer.principal, ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.ALTER
    )


async def cluster_view(
    services: Services, viewer: Viewer
) -> tuple[list[CoordinatorRow], list[LeaseRow], list[NodeRow]]:
    """Coordinators with the log partitions they hold, every lease row, every node."""
    settings = services.settings
    now = services.lease_clock.now_ms()
    horizon = now - FORGET_AFTER_LEASES * settings.lease_ms
    instance_rows, lease_rows, beat_rows = await services.db.run(_read_cluster, now, horizon)
    lease_list = [
        LeaseRow(
            log_partition=int(r.log_partition), owner=r.owner,
            owner_node_id=None if r.owner_node_id is None else int(r.owner_node_id),
            coordinator_epoch=int(r.coordinator_epoch),
            expires_in_ms=int(r.expires_at_ms) - now,
        )
        for r in lease_rows
    ]
    held: dict[str, list[int]] = {}
    for lease in lease_list:
        if lease.alive and lease.owner is not None and lease.log_partition >= 0:
            held.setdefault(lease.owner, []).append(lease.log_partition)
    coordinators = [
        CoordinatorRow(
            node_id=int(r.id), instance_id=str(r.instance_id), url=str(r.url),
            heartbeat_age_ms=now - int(r.heartbeat_ms) if r.heartbeat_ms else None,
            alive=int(r.heartbeat_ms) >= now - settings.lease_ms,
            is_self=int(r.id) == services.node_id,
            log_partitions=tuple(held.get(str(r.instance_id), ())),
        )
        for r in instance_rows
    ]
    beats = {int(r.node_id): int(r.heartbeat_ms) for r in beat_rows}
    nodes = await _node_health(services, beats, now)
    return coordinators, lease_list, nodes


async def _node_health(services: Services, beats: dict[int, int], now_ms: int) -> list[NodeRow]:
    urls = services.metadata.nodes
    ids = sorted(urls)
    limit = asyncio.Semaphore(NODE_CONCURRENCY)
    answers = await asyncio.gather(*(
        ask(limit, partial(services.http.get, f"{urls[n]}/readyz", timeout=NODE_TIMEOUT_S))
        for n in ids
    ))
    rows = []
    for node_id, (answer, error, latency) in zip(ids, answers, strict=True):
        if answer is None:
            status = "down"
        elif answer.status_code == 200:
            status = "ready"
        else:
            status = _status_field(answer) or f"HTTP {answer.status_code}"
        beat = beats.get(node_id)
        rows.append(NodeRow(
            node_id=node_id, url=urls[node_id], status=status,
            latency_ms=latency if answer is not None else None,
            heartbeat_age_ms=now_ms - beat if beat else None, error=error,
        ))  # fmt: skip
    return rows


def _status_field(answer: httpx.Response) -> str | None:
    try:
        status = answer.json().get("status")
    except (ValueError, AttributeError):
        return None
    return str(status) if status else None


# --- the transactions page -----------------------------------------------------------------


def transaction_row(rec: TxnRecord, now_ms: int) -> TransactionRow:
    is_open = rec.state is TransactionState.ONGOING or rec.state.is_prepare
    age = max(0, now_ms - rec.txn_start_ms) if is_open and rec.txn_start_ms else None
    return TransactionRow(
        transactional_id=rec.transactional_id, producer_id=rec.producer_id,
        producer_epoch=rec.producer_epoch, state=rec.state.value, age_ms=age,
        since_update_ms=max(0, now_ms - rec.last_update_ms), timeout_ms=rec.timeout_ms,
        partitions=tuple(rec.partitions), is_open=is_open,
    )


async def transactions_view(
    services: Services, viewer: Viewer
) -> tuple[list[TransactionRow], list[TransactionRow]]:
    """The open transactions (oldest first) and the most recently ended ones."""
    now = services.clock.now_ms()
    records = await services.db.run(services.store.list_all, None)
    rows = [
        transaction_row(rec, now) for rec in records
        if services.access.allowed(viewer.principal, ResourceType.TRANSACTIONAL_ID,
                                   rec.transactional_id, Operation.DESCRIBE)
    ]  # fmt: skip
    open_rows = sorted((r for r in rows if r.is_open), key=lambda r: -(r.age_ms or 0))
    ended = sorted((r for r in rows if not r.is_open), key=lambda r: r.since_update_ms)
    return open_rows, ended[:RECENT_ENDED]


def hanging_report(status: int, body: Any) -> HangingReport:
    """The answer of ``GET /v1/admin/hanging-transactions`` as the page shows it."""
    if status == 404:
        return HangingReport(None, None, (), "this coordinator has no hanging-transaction "
                             "detector")
    if status != 200 or not isinstance(body, dict):
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        return HangingReport(None, None, (), f"HTTP {status}: {message or 'no report'}")
    rows = tuple(
        HangingRow(
            topic=str(h["topic"]), partition=int(h["partition"]),
            producer_id=int(h["producer_id"]), producer_epoch=int(h["producer_epoch"]),
            first_offset=int(h["first_offset"]), age_ms=int(h["age_ms"]),
            reason=str(h["reason"]), transactional_id=h.get("transactional_id"),
            coordinator_state=h.get("coordinator_state"),
        )
        for h in body.get("hanging", [])
    )
    return HangingReport(
        checked_at_ms=body.get("checked_at_ms"), open_on_nodes=body.get("open_on_nodes"),
        rows=rows, error=None,
    )
