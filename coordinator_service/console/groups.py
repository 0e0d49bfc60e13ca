"""The consumer groups pages' rows: the list of groups, and one group's members and lag.

* The groups page lists the groups on record that the viewer may describe, by id, with
  their state, member count and group epoch, ``GROUPS_PER_PAGE`` a page. It is
  ``GET /v1/groups`` (the same function answers both, so the two never disagree) and reads
  the coordinator's database only.
* A group's page is what ``GET /v1/groups/{id}`` describes: the state and epochs, every
  member with its subscription and its assigned, pending-revocation and target partitions,
  and the lag of each partition (committed offset, last stable offset, lag, owner),
  ``LAG_ROWS_PER_PAGE`` a page, with the group's total.

The lag is read as the viewer, like everything the console shows: the committed offsets
from the node leading the group's ``__consumer_offsets`` partition, with the viewer's token
(the node wants read on the group, and lists only the topics the viewer may describe), and
the last stable offsets from the storage nodes' partition lists, **one request to each
node** that leads a partition of the group, as the topics pages ask them (``topics.py``).
The live refresh asks again every two seconds, so nothing is asked per partition. Offsets
that cannot be read cost the table, not the page: ``lag_error`` says why (the offsets node
away, a refusal, no answer in time); a partition whose leader gave no number shows a dash
and why, and is left out of the total and counted as unread.

Group ids are free text. Every id is escaped by the templates, and every link is built with
``eos_protocol.paths.segment``: a ``/`` travels as ``%2F`` and the route takes the rest of
the path as the id, so ``a/b`` and ``<script>`` link to their own pages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from coordinator_service.api import groups as groups_api
from coordinator_service.console.session import ConsoleRefusal
from coordinator_service.console.snapshot import NODE_TIMEOUT_S, Viewer
from coordinator_service.console.topics import (
    NodeAnswer,
    NodeError,
    Paging,
    Place,
    int_field,
    leader_numbers,
    node_errors_of,
    node_lists,
    page_of,
)
from coordinator_service.groups import store
from coordinator_service.groups.lag_sampler import subscribed_partitions
from coordinator_service.groups.membership import Group
from coordinator_service.services import Services
from eos_protocol.acl import Operation, ResourceType
from eos_protocol.common import TopicPartition
from eos_protocol.errors import EosError
from eos_protocol.groups import GroupMemberDescription
from eos_protocol.paths import segment

#: Groups on the groups page, and partitions in a group's lag table, per page.
GROUPS_PER_PAGE = 100
LAG_ROWS_PER_PAGE = 200
#: How long a group's page waits for the node that holds its committed offsets.
OFFSETS_TIMEOUT_S = NODE_TIMEOUT_S
GROUPS_BASE = "/console/groups"

Key = tuple[str, int]


def group_href(group_id: str) -> str | None:
    """The address of a group's page; None for an id no path can carry (``.``, ``..``)."""
    try:
        return f"{GROUPS_BASE}/{segment(group_id)}"
    except EosError:
        return None


@dataclass(frozen=True)
class GroupRow:
    group_id: str
    state: str
    members: int
    group_epoch: int

    @property
    def href(self) -> str | None:
        return group_href(self.group_id)


@dataclass(frozen=True)
class GroupsView:
    groups: list[GroupRow]
    paging: Paging


@dataclass(frozen=True)
class MemberRow:
    member_id: str
    instance_id: str | None
    client_host: str | None
    member_epoch: int
    state: str
    subscription: str  # topic names, or the regular expression
    assigned: tuple[Key, ...]
    pending_revocation: tuple[Key, ...]
    target: tuple[Key, ...]


@dataclass(frozen=True)
class LagRow:
    topic: str
    partition: int
    committed_offset: int | None
    last_stable_offset: int | None
    lag: int | None
    owner: str | None
    error: str | None  # why there is no last stable offset


@dataclass(frozen=True)
class GroupView:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    members: list[MemberRow]
    lag: list[LagRow]  # this page's rows
    paging: Paging
    total_lag: int  # over every partition with a number, not only this page's
    unread: int  # partitions whose leader gave no last stable offset
    lag_error: str | None  # why there is no lag table at all
    node_errors: list[NodeError] = field(default_factory=list)


async def groups_view(services: Services, viewer: Viewer, *, page: int) -> GroupsView:
    """The page-th ``GROUPS_PER_PAGE`` groups the viewer may describe, by id."""
    listed = (await groups_api.list_groups(services, viewer.principal)).groups
    page_of(len(listed), page, GROUPS_PER_PAGE, "the group list")
    paging = Paging(page, GROUPS_PER_PAGE, len(listed), GROUPS_BASE)
    return GroupsView(
        groups=[GroupRow(g.group_id, g.state, g.members, g.group_epoch)
                for g in listed[paging.start:paging.stop]],
        paging=paging,
    )  # fmt: skip


def _keys(parts: Iterable[TopicPartition]) -> tuple[Key, ...]:
    return tuple((tp.topic, tp.partition) for tp in parts)


def member_row(m: GroupMemberDescription) -> MemberRow:
    subscription = (
        f"regex {m.subscribed_topic_regex}" if m.subscribed_topic_regex
        else ", ".join(m.subscribed_topic_names) or "—"
    )
    return MemberRow(
        member_id=m.member_id, instance_id=m.instance_id, client_host=m.client_host,
        member_epoch=m.member_epoch, state=m.state, subscription=subscription,
        assigned=_keys(m.assignment), pending_revocation=_keys(m.partitions_pending_revocation),
        target=_keys(m.target_assignment),
    )  # fmt: skip


async def _load(services: Services, group_id: str) -> Group | None:
    """The group as ``GET /v1/groups/{id}`` reads it: its coordinator's copy when this
    instance is that, else the database's."""
    cached = services.groups.cached(group_id)
    return cached if cached is not None else await services.db.run(store.load_group, group_id)


async def group_view(
    services: Services, viewer: Viewer, group_id: str, *, page: int
) -> GroupView:
    """One group's members and its lag table's page-th ``LAG_ROWS_PER_PAGE`` partitions.

    Refused as the API refuses ``GET /v1/groups/{id}``: 403 without describe on the group
    (asked first, so the answer tells nothing of a group the viewer may not see), 404 for
    a group not on record.
    """
    if not services.access.allowed(viewer.principal, ResourceType.GROUP, group_id,
                                   Operation.DESCRIBE):
        raise ConsoleRefusal(403, f"{viewer.principal} may not describe group {group_id!r}.")
    group = await _load(services, group_id) if group_id else None
    if group is None:
        raise ConsoleRefusal(404, f"No consumer group {group_id!r} is on record.")
    described = groups_api.describe_group(group)
    owners = {tp: m.member_id for m in group.members.values() for tp in m.assigned}
    subscribed = subscribed_partitions(group)
    rows: list[LagRow] = []
    lag_error: str | None = None
    answers: dict[int, NodeAnswer] = {}
    try:
        committed = await asyncio.wait_for(
            services.group_offsets.committed(group_id, viewer.headers()), OFFSETS_TIMEOUT_S
        )
    except TimeoutError:
        lag_error = (f"the storage node holding the group's committed offsets did not "
                     f"answer within {OFFSETS_TIMEOUT_S:g} s")
    except (EosError, httpx.HTTPError) as exc:
        lag_error = str(exc) or type(exc).__name__
    else:
        rows, answers = await _lag_rows(services, viewer, subscribed | committed.keys(),
                                        committed, owners)
    page_of(len(rows), page, LAG_ROWS_PER_PAGE, f"group {group_id}'s partitions")
    href = group_href(group_id) or GROUPS_BASE
    paging = Paging(page, LAG_ROWS_PER_PAGE, len(rows), href)
    return GroupView(
        group_id=group_id, state=described.state, group_epoch=described.group_epoch,
        assignment_epoch=described.assignment_epoch,
        members=[member_row(m) for m in described.members],
        lag=rows[paging.start:paging.stop], paging=paging,
        total_lag=sum(r.lag for r in rows if r.lag is not None),
        unread=sum(1 for r in rows if r.lag is None), lag_error=lag_error,
        node_errors=node_errors_of(services, answers),
    )  # fmt: skip


async def _lag_rows(
    services: Services, viewer: Viewer, keys: Iterable[Key], committed: dict[Key, int],
    owners: dict[Key, str],
) -> tuple[list[LagRow], dict[int, NodeAnswer]]:
    """A row per partition, by topic and index, with the last stable offsets of the
    partitions' leaders (one list from each, narrowed to the topic when there is one)."""
    wanted = sorted(keys)
    placed: dict[str, dict[int, Place]] = {
        t.name: {index: (index, p) for index, p in t.partitions}
        for t in services.metadata.cached_placements()
    }
    places = {key: placed.get(key[0], {}).get(key[1]) for key in wanted}
    leaders = {place[1].leader for place in places.values() if place is not None}
    topics = {t for t, _ in wanted}
    params: dict[str, str] = {}
    if len(topics) == 1:
        indexes = [p for _, p in wanted]
        params = {"topic": next(iter(topics)), "first_partition": str(min(indexes)),
                  "last_partition": str(max(indexes))}
    answers = await node_lists(services, viewer, leaders, params) if leaders else {}
    rows = []
    for (topic, index), place in places.items():
        done = committed.get((topic, index))
        note: str | None
        if place is None:
            stable, note = None, "no such partition in this cluster's metadata (deleted?)"
        else:
            found, note = leader_numbers(topic, place, answers)
            stable = int_field(found, "last_stable_offset")
            if stable is None and note is None:
                note = "its leader gave no last stable offset"
        lag = None if stable is None else max(0, stable - (done if done is not None else 0))
        rows.append(LagRow(
            topic=topic, partition=index, committed_offset=done, last_stable_offset=stable,
            lag=lag, owner=owners.get((topic, index)), error=None if stable is not None else note,
        ))  # fmt: skip
    return rows, answers
