"""The topics pages' rows: a list of topics, and one topic's partitions, a page at a time.

A cluster may hold thousands of partitions, so neither page asks anything per partition.
The placement (leader, replicas, ISR) is the coordinator's metadata; the offsets and
producers come from the storage nodes' own lists (``GET /v1/partitions`` on a node, with
the viewer's token): **one request to each node** that leads a partition the page shows,
all at once, each with the short ``NODE_TIMEOUT_S``. A node that does not answer costs
its partitions their numbers (an ``error`` on their rows, a count of unread partitions on
their topics), never the page.

* The topics page lists every topic the viewer may describe, by name, with its partition
  count, replication factor, under-replicated partitions (ISR smaller than the replicas),
  offline partitions (no leader) and its **LSO lag**: the sum over its partitions of high
  watermark - last stable offset, the records written but not yet readable by a
  read_committed consumer (the per-partition lag the page always showed, summed as Kafka's
  tools sum consumer lag). Internal topics (``__consumer_offsets``) are left out unless
  asked for: fifty partitions of bookkeeping would otherwise come first.
* A topic's page lists ``PARTITIONS_PER_PAGE`` of its partitions, with the producers of
  each; the nodes are asked for that topic and that range of partitions only.

A group's page (``groups.py``) reads the last stable offsets of the group's partitions
through the same lists (``node_lists``, ``leader_numbers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlencode

import orjson

from coordinator_service.console.session import ConsoleRefusal
from coordinator_service.console.snapshot import (
    NODE_CONCURRENCY,
    NODE_TIMEOUT_S,
    Viewer,
    ask,
    refusal_of,
)
from coordinator_service.controller.metadata import CachedPartition, TopicPlacement
from coordinator_service.services import Services
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, topic_name_problem
from eos_protocol.errors import UnknownTopicOrPartitionError
from eos_protocol.replication import NO_LEADER

#: Topics the cluster keeps for itself, shown only when asked (``?internal=1``).
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC})
#: Rows of the topics page, and partitions of a topic's page, per page.
TOPICS_PER_PAGE = 100
PARTITIONS_PER_PAGE = 200
#: The node route every page reads its numbers from.
NODE_LIST_PATH = "/v1/partitions"


@dataclass(frozen=True)
class ProducerRow:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    coordinator_epoch: int
    current_txn_start_offset: int | None
    last_timestamp_ms: int


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    leader: int
    leader_url: str
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    log_start_offset: int | None
    high_watermark: int | None
    last_stable_offset: int | None
    producers: tuple[ProducerRow, ...]
    error: str | None

    @property
    def lso_lag(self) -> int | None:
        """Records written but not yet readable by a read_committed consumer: HW - LSO."""
        if self.high_watermark is None or self.last_stable_offset is None:
            return None
        return self.high_watermark - self.last_stable_offset


@dataclass(frozen=True)
class TopicRow:
    name: str
    internal: bool
    partitions: int
    replication_factor: int
    under_replicated: int
    offline: int  # no leader
    lso_lag: int  # summed over the partitions read
    unread: int  # partitions whose leader gave no numbers (down, refused, not created yet)


@dataclass(frozen=True)
class NodeError:
    node_id: int
    url: str
    error: str


@dataclass(frozen=True)
class Paging:
    """Where a page sits in a list: 1-based ``page`` of ``pages``, items ``start`` (0-based)
    up to ``stop`` of ``total``; ``href`` links another page with the same parameters."""

    page: int
    per_page: int
    total: int
    base: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    @property
    def start(self) -> int:
        return (self.page - 1) * self.per_page

    @property
    def stop(self) -> int:
        return min(self.total, self.start + self.per_page)

    def href(self, page: int) -> str:
        params = [*self.params, *((("page", str(page)),) if page > 1 else ())]
        return f"{self.base}?{urlencode(params)}" if params else self.base

    def window(self, around: int = 2) -> list[int | None]:
        """The page numbers a pager links: the first, the last and ``around`` either side
        of this one, None where numbers are left out."""
        wanted = {1, self.pages, *range(self.page - around, self.page + around + 1)}
        shown: list[int | None] = []
        for n in sorted(n for n in wanted if 1 <= n <= self.pages):
            if shown and shown[-1] is not None and n > shown[-1] + 1:
                shown.append(None)
            shown.append(n)
        return shown


@dataclass(frozen=True)
class TopicsView:
    topics: list[TopicRow]
    paging: Paging
    show_internal: bool
    internal_count: int  # internal topics the viewer may describe (shown or not)
    node_errors: list[NodeError] = field(default_factory=list)


@dataclass(frozen=True)
class TopicView:
    topic: TopicRow
    min_insync_replicas: int
    partitions: list[PartitionRow]
    paging: Paging
    node_errors: list[NodeError] = field(default_factory=list)


@dataclass(frozen=True)
class NodeAnswer:
    """One node's list, by (topic, partition), or why there is none."""

    rows: dict[tuple[str, int], dict[str, Any]]
    error: str | None


def page_of(total: int, page: int, per_page: int, what: str) -> None:
    """Refuse (404) a page past the last one: a link kept from a larger list."""
    pages = max(1, -(-total // per_page))
    if page > pages:
        raise ConsoleRefusal(404, f"There is no page {page} of {what}: it has {pages} "
                                  f"page{'s' if pages != 1 else ''}.")


# --- asking the nodes ----------------------------------------------------------------------


async def node_lists(
    services: Services, viewer: Viewer, leaders: Iterable[int], params: dict[str, str]
) -> dict[int, NodeAnswer]:
    """Each of ``leaders`` asked once for its list, all at once."""
    ids = sorted(set(leaders) - {NO_LEADER})
    limit = asyncio.Semaphore(NODE_CONCURRENCY)
    answers = await asyncio.gather(*(
        _node_list(services, viewer, limit, node_id, params) for node_id in ids
    ))  # fmt: skip
    return dict(zip(ids, answers, strict=True))


async def _node_list(
    services: Services, viewer: Viewer, limit: asyncio.Semaphore, node_id: int,
    params: dict[str, str],
) -> NodeAnswer:
    url = services.metadata.nodes.get(node_id)
    if not url:
        return NodeAnswer({}, "not a node of this cluster")
    answer, error, _ = await ask(limit, partial(
        services.http.get, f"{url}{NODE_LIST_PATH}", params=params,
        headers=viewer.headers(), timeout=NODE_TIMEOUT_S,
    ))  # fmt: skip
    if answer is None:
        return NodeAnswer({}, error)
    if answer.status_code in (404, 405):  # no such route: a node of 0.2.0
        return NodeAnswer({}, f"has no partition list ({NODE_LIST_PATH}): a node of an "
                              "older release, to be upgraded")
    if answer.status_code != 200:
        return NodeAnswer({}, refusal_of(answer))
    try:
        listed = orjson.loads(answer.content)["partitions"]
        rows = {(str(r["topic"]), int(r["partition"])): r for r in listed}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return NodeAnswer({}, "answered something that is not a partition list")
    return NodeAnswer(rows, None)


def node_errors_of(services: Services, answers: dict[int, NodeAnswer]) -> list[NodeError]:
    return [
        NodeError(node_id, services.metadata.nodes.get(node_id, ""), answer.error)
        for node_id, answer in sorted(answers.items()) if answer.error is not None
    ]  # fmt: skip


#: One partition as the metadata cache holds it: its index and placement.
Place = tuple[int, CachedPartition]


def leader_numbers(
    topic: str, place: Place, answers: dict[int, NodeAnswer]
) -> tuple[dict[str, Any] | None, str | None]:
    """The leader's row for a partition, and a note on it (why it is missing, or that the
    node does not see itself as the leader)."""
    index, p = place
    leader = p.leader
    if leader == NO_LEADER:
        return None, "no live leader"
    answer = answers.get(leader)
    if answer is None:
        return None, f"leader {leader} not asked"
    if answer.error is not None:
        return None, f"leader {leader}: {answer.error}"
    row = answer.rows.get((topic, index))
    if row is None:
        if not p.created:
            return None, f"not created on leader {leader} yet"
        return None, f"not listed by leader {leader}"
    if not row.get("leader", True):
        return row, f"node {leader} does not lead it (its own view)"
    return row, None


def int_field(row: dict[str, Any] | None, key: str) -> int | None:
    value = None if row is None else row.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _producers(row: dict[str, Any] | None) -> tuple[ProducerRow, ...]:
    if row is None:
        return ()
    return tuple(
        ProducerRow(
            producer_id=int(e["producer_id"]), producer_epoch=int(e["producer_epoch"]),
            last_sequence=int(e["last_sequence"]), coordinator_epoch=int(e["coordinator_epoch"]),
            current_txn_start_offset=e.get("current_txn_start_offset"),
            last_timestamp_ms=int(e["last_timestamp_ms"]),
        )
        for e in row.get("producers") or ()
    )


def partition_row(
    topic: str, place: Place, answers: dict[int, NodeAnswer], nodes: dict[int, str]
) -> PartitionRow:
    row, note = leader_numbers(topic, place, answers)
    index, p = place
    try:
        producers = _producers(row)
    except (KeyError, TypeError, ValueError):
        producers, note = (), f"leader {p.leader} answered unreadable producers"
    return PartitionRow(
        topic=topic, partition=index, leader=p.leader, leader_url=nodes.get(p.leader, ""),
        replicas=p.replicas, isr=p.isr,
        log_start_offset=int_field(row, "log_start_offset"),
        high_watermark=int_field(row, "high_watermark"),
        last_stable_offset=int_field(row, "last_stable_offset"),
        producers=producers, error=note,
    )  # fmt: skip


def topic_row(
    topic: TopicPlacement, answers: dict[int, NodeAnswer],
    read: Sequence[Place] | None = None,
) -> TopicRow:
    """A topic's counts from the metadata (all its partitions), its LSO lag and unread
    count from the partitions in ``read`` (all by default: those the nodes were asked
    for)."""
    lag = unread = 0
    for place in topic.partitions if read is None else read:
        row, _ = leader_numbers(topic.name, place, answers)
        high, stable = int_field(row, "high_watermark"), int_field(row, "last_stable_offset")
        if high is None or stable is None:
            unread += 1
        else:
            lag += high - stable
    return TopicRow(
        name=topic.name, internal=topic.name in INTERNAL_TOPICS,
        partitions=len(topic.partitions), replication_factor=topic.config.replication_factor,
        under_replicated=sum(1 for _, p in topic.partitions if len(p.isr) < len(p.replicas)),
        offline=sum(1 for _, p in topic.partitions if p.leader == NO_LEADER),
        lso_lag=lag, unread=unread,
    )  # fmt: skip


# --- the pages -----------------------------------------------------------------------------


async def topics_view(
    services: Services, viewer: Viewer, *, page: int, show_internal: bool
) -> TopicsView:
    """The page-th ``TOPICS_PER_PAGE`` topics the viewer may describe, by name.

    The placement is the metadata cache's (read again every ``metadata_refresh_ms``):
    reading every partition from the database and making a model of each, as
    ``GET /v1/metadata`` does, was most of this page's time with 5,000 partitions.
    """
    described = [
        t for t in services.metadata.cached_placements()
        if services.access.allowed(viewer.principal, ResourceType.TOPIC, t.name,
                                   Operation.DESCRIBE)
    ]  # fmt: skip
    internal = sum(1 for t in described if t.name in INTERNAL_TOPICS)
    listed = [t for t in described if show_internal or t.name not in INTERNAL_TOPICS]
    page_of(len(listed), page, TOPICS_PER_PAGE, "the topic list")
    paging = Paging(page, TOPICS_PER_PAGE, len(listed), "/console/topics",
                    (("internal", "1"),) if show_internal else ())
    shown = listed[paging.start:paging.stop]
    leaders = {p.leader for t in shown for _, p in t.partitions}
    answers = await node_lists(services, viewer, leaders, {})
    return TopicsView(
        topics=[topic_row(t, answers) for t in shown], paging=paging,
        show_internal=show_internal, internal_count=internal,
        node_errors=node_errors_of(services, answers),
    )  # fmt: skip


async def topic_view(services: Services, viewer: Viewer, name: str, *, page: int) -> TopicView:
    """One topic's page-th ``PARTITIONS_PER_PAGE`` partitions, with their producers.

    Refused as the API refuses ``GET /v1/topics/{name}``: 403 without describe on the
    topic (asked first, so the answer tells nothing of a topic the viewer may not see),
    404 for a topic that does not exist. The topic is read afresh, as the API reads it.
    """
    if not services.access.allowed(viewer.principal, ResourceType.TOPIC, name,
                                   Operation.DESCRIBE):
        raise ConsoleRefusal(403, f"{viewer.principal} may not describe topic {name!r}.")
    problem = topic_name_problem(name)
    if problem is not None:
        raise ConsoleRefusal(404, f"No topic {name!r}: {problem}.")
    try:
        topic = await services.metadata.placement(name)
    except UnknownTopicOrPartitionError as exc:
        raise ConsoleRefusal(404, f"No topic {name!r} in this cluster.") from exc
    page_of(len(topic.partitions), page, PARTITIONS_PER_PAGE, f"topic {name}")
    paging = Paging(page, PARTITIONS_PER_PAGE, len(topic.partitions),
                    f"/console/topics/{name}")
    shown = topic.partitions[paging.start:paging.stop]
    answers: dict[int, NodeAnswer] = {}
    if shown:
        params = {"topic": name, "first_partition": str(shown[0][0]),
                  "last_partition": str(shown[-1][0]), "producers": "true"}
        answers = await node_lists(services, viewer, {p.leader for _, p in shown}, params)
    nodes = services.metadata.nodes
    return TopicView(
        topic=topic_row(topic, answers, shown),
        min_insync_replicas=topic.config.min_insync_replicas,
        partitions=[partition_row(name, place, answers, nodes) for place in shown],
        paging=paging, node_errors=node_errors_of(services, answers),
    )  # fmt: skip
