"""What the client knows about the cluster: the coordinators it may ask, partitions and
their leaders, the coordinator of its transactional id, the storage node of each consumer
group's offsets and the coordinator of each group's membership. No I/O here.

The coordinators come from ``bootstrap`` (one URL, a comma-separated list, or a sequence,
as Kafka's ``bootstrap.servers``) and from the live instances the cluster names
(``coordinators`` in ``GET /v1/metadata``). Requests that any instance answers go to the
first one not set aside; an instance that did not answer is set aside for a while, so the
loss of the one a client bootstrapped on costs it one failed attempt.

Placement never changes once written (docs/design.md §4), so entries live until a request says
otherwise: NOT_LEADER_OR_FOLLOWER or a lost connection drops a topic; NOT_COORDINATOR moves
the coordinator to the URL the answer names (or forgets it, to be found again).

The cluster's ``features`` (what its coordinators understand, ``sdk._versions``) come with
the same metadata answer as the live coordinators, and are refreshed with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from eos_protocol.addresses import AddressError, check_url, parse_url_list
from eos_protocol.common import read_answer
from eos_protocol.errors import LeaderNotAvailableError, UnknownTopicOrPartitionError
from eos_protocol.paths import segment
from eos_protocol.versions import (
    PREVIOUS_RELEASE_FEATURES,
    ClusterFeatures,
    features_of_metadata,
)
from sdk._transport import refind_target
from sdk._types import TopicPartition

#: How long an instance that did not answer is passed over.
SET_ASIDE_S = 5.0
#: How often the live coordinators are learned again (Kafka's ``metadata.max.age.ms``).
MEMBERS_MAX_AGE_S = 300.0

Bootstrap = str | Sequence[str]


class CoordinatorEndpoints:
    """The coordinator instances a client may ask, in order of preference."""

    def __init__(self, bootstrap: Bootstrap, clock: Callable[[], float] = time.monotonic) -> None:
        self.configured = parse_url_list(bootstrap, "bootstrap")
        self._learned: dict[str, float] = {}  # URL -> when the cluster last named it
        self._down_until: dict[str, float] = {}
        self._clock = clock
        self._learned_at: float | None = None

    @property
    def known(self) -> list[str]:
        return self.configured + [u for u in self._learned if u not in self.configured]

    def _forget_old(self, now: float) -> None:
        for url, seen in list(self._learned.items()):
            if now - seen > MEMBERS_MAX_AGE_S:
                del self._learned[url]

    def current(self) -> str:
        """The first instance not set aside; when all are, the soonest back."""
        now = self._clock()
        known = self.known
        for url in known:
            if self._down_until.get(url, 0.0) <= now:
                return url
        return min(known, key=lambda u: self._down_until.get(u, 0.0))

    def set_aside(self, url: str) -> None:
        """``url`` did not answer: ask the others first for a while."""
        url = url.rstrip("/")
        if url in self.known:
            self._down_until[url] = self._clock() + SET_ASIDE_S
            self._learned_at = None  # the membership may have changed: learn it again

    def learn(self, urls: list[str]) -> None:
        """Add the instances the cluster named now. One answer that leaves an instance
        out (its heartbeat late by a moment) does not make the client forget it: only
        an instance unnamed for ``MEMBERS_MAX_AGE_S`` is dropped."""
        now = self._clock()
        for url in urls:
            try:
                self._learned[check_url(url)] = now
            except AddressError:
                continue  # an instance whose advertised URL no request could use
        self._forget_old(now)
        self._learned_at = now

    def learn_due(self) -> bool:
        return self._learned_at is None or self._clock() - self._learned_at > MEMBERS_MAX_AGE_S

    def learning_tried(self) -> None:
        """A learning call was made (whatever came of it): not again before the max age,
        unless an instance stops answering."""
        self._learned_at = self._clock()


class MetadataCache:
    """Leaders and coordinators, keyed by what the client asks about."""

    def __init__(self, bootstrap: Bootstrap) -> None:
        self.endpoints = CoordinatorEndpoints(bootstrap)
        self._leaders: dict[str, list[str]] = {}
        self._stale: set[str] = set()  # leaders to look up again (the count stays valid)
        self.txn_coordinator: str | None = None
        self._group_nodes: dict[str, str] = {}
        self._group_coordinators: dict[str, str] = {}  # membership (heartbeats)
        #: What the cluster understands; None until a metadata answer came.
        self.features: ClusterFeatures | None = None

    # --- topics --------------------------------------------------------------------------

    def update_topic(self, body: dict[str, Any]) -> list[str]:
        """Store a ``TopicInfo`` answer (``GET /v1/topics/{t}`` or ``POST /v1/topics``);
        returns the leaders' URLs by partition."""
        parts = sorted(body["partitions"], key=lambda p: int(p["partition"]))
        name = str(body["name"])
        leaders = [str(p["leader"]["url"]).rstrip("/") for p in parts]
        self._leaders[name] = leaders
        self._stale.discard(name)
        return leaders

    @property
    def bootstrap_url(self) -> str:
        """The coordinator to ask what any instance answers."""
        return self.endpoints.current()

    def update_metadata(self, body: dict[str, Any]) -> None:
        """Store a ``GET /v1/metadata`` answer: topics, live coordinators, features."""
        for topic in body.get("topics", []):
            self.update_topic(topic)
        # an answer without coordinators (an older release) still counts as learned
        self.endpoints.learn([str(c["url"]) for c in body.get("coordinators", [])])
        self.features = features_of(body)

    def unreachable(self, url: str) -> None:
        """A request to ``url`` got no answer: pass over it if it is a coordinator."""
        self.endpoints.set_aside(url)

    def partition_count(self, topic: str) -> int | None:
        leaders = self._leaders.get(topic)
        return None if leaders is None else len(leaders)

    def leader(self, tp: TopicPartition) -> str | None:
        """The partition's leader, or None when it must be looked up (again).
        ``LEADER_NOT_AVAILABLE`` (retriable: look it up again after a backoff) while the
        partition has no live leader, which the metadata shows as an empty URL."""
        leaders = self._leaders.get(tp.topic)
        if leaders is None or tp.topic in self._stale:
            return None
        if not 0 <= tp.partition < len(leaders):
            raise UnknownTopicOrPartitionError(
                f"{tp.topic} has {len(leaders)} partitions; there is no partition {tp.partition}"
            )
        url = leaders[tp.partition]
        if not url:
            self._stale.add(tp.topic)
            raise LeaderNotAvailableError(f"{tp.topic}-{tp.partition} has no live leader now")
        return url

    def invalidate_topic(self, topic: str) -> None:
        """Look the leaders up again before the next request; a topic's partition count
        never changes, so it stays known (a send in another thread may be using it)."""
        if topic in self._leaders:
            self._stale.add(topic)

    # --- coordinators --------------------------------------------------------------------

    def invalidate_txn_coordinator(self, exc: BaseException) -> None:
        self.txn_coordinator = refind_target(exc)

    def group_node(self, group_id: str) -> str | None:
        return self._group_nodes.get(group_id)

    def set_group_node(self, group_id: str, url: str) -> None:
        self._group_nodes[group_id] = url.rstrip("/")

    def invalidate_group(self, group_id: str) -> None:
        self._group_nodes.pop(group_id, None)

    def group_coordinator(self, group_id: str) -> str | None:
        """The coordinator that owns ``group_id``'s membership (its heartbeats)."""
        return self._group_coordinators.get(group_id)

    def set_group_coordinator(self, group_id: str, url: str) -> None:
        self._group_coordinators[group_id] = url.rstrip("/")

    def invalidate_group_coordinator(self, group_id: str, exc: BaseException) -> None:
        """As for a transactional id: go to the owner a NOT_COORDINATOR names, or find
        it again."""
        url = refind_target(exc)
        if url is None:
            self._group_coordinators.pop(group_id, None)
        else:
            self._group_coordinators[group_id] = url


def features_of(metadata: dict[str, Any]) -> ClusterFeatures:
    """The features a metadata answer names; the previous release's when it names none
    (or names them in a shape this client cannot read: the oldest requests are the safe
    ones)."""
    raw = features_of_metadata(metadata)
    if isinstance(raw, ClusterFeatures):
        return raw
    try:
        return read_answer(ClusterFeatures, raw)
    except ValidationError:
        return PREVIOUS_RELEASE_FEATURES


def topic_path(topic: str) -> str:
    return f"/v1/topics/{segment(topic)}"


def partition_path(tp: TopicPartition, action: str) -> str:
    """``/v1/partitions/{topic}/{partition}/{action}`` (records, offsets, producers)."""
    return f"/v1/partitions/{segment(tp.topic)}/{segment(tp.partition)}/{action}"


#: The multi-partition produce of a storage node (``eos_protocol.produce_many``).
PRODUCE_MANY_PATH = "/v1/produce"
#: DescribeProducers of many partitions of a storage node (``eos_protocol.node``).
DESCRIBE_PRODUCERS_MANY_PATH = "/v1/producers/describe"


def records_path(tp: TopicPartition) -> str:
    return partition_path(tp, "records")


def txn_path(transactional_id: str, action: str) -> str:
    return f"/v1/transactions/{segment(transactional_id)}/{action}"


def group_path(group_id: str, action: str) -> str:
    return f"/v1/groups/{segment(group_id)}/{action}"


def find_coordinator_params(key: str, key_type: str) -> dict[str, str]:
    return {"key": key, "key_type": key_type}
