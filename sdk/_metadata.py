"""What the client knows about the cluster: partitions and their leaders, the coordinator
of its transactional id, the storage node of each consumer group. No I/O here.

Placement never changes once written (DESIGN.md §4), so entries live until a request says
otherwise: NOT_LEADER_OR_FOLLOWER or a lost connection drops a topic; NOT_COORDINATOR moves
the coordinator to the URL the answer names (or forgets it, to be found again).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sdk._transport import refind_target
from sdk._types import TopicPartition
from sdk.protocol.errors import UnknownTopicOrPartitionError


class MetadataCache:
    """Leaders and coordinators, keyed by what the client asks about."""

    def __init__(self, bootstrap_url: str) -> None:
        self.bootstrap_url = bootstrap_url.rstrip("/")
        self._leaders: dict[str, list[str]] = {}
        self._stale: set[str] = set()  # leaders to look up again (the count stays valid)
        self.txn_coordinator: str | None = None
        self._group_nodes: dict[str, str] = {}

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

    def update_metadata(self, body: dict[str, Any]) -> None:
        for topic in body.get("topics", []):
            self.update_topic(topic)

    def partition_count(self, topic: str) -> int | None:
        leaders = self._leaders.get(topic)
        return None if leaders is None else len(leaders)

    def leader(self, tp: TopicPartition) -> str | None:
        """The partition's leader, or None when it must be looked up (again)."""
        leaders = self._leaders.get(tp.topic)
        if leaders is None or tp.topic in self._stale:
            return None
        if not 0 <= tp.partition < len(leaders):
            raise UnknownTopicOrPartitionError(
                f"{tp.topic} has {len(leaders)} partitions; there is no partition {tp.partition}"
            )
        return leaders[tp.partition]

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


def topic_path(topic: str) -> str:
    return f"/v1/topics/{topic}"


def records_path(tp: TopicPartition) -> str:
    return f"/v1/partitions/{tp.topic}/{tp.partition}/records"


def txn_path(transactional_id: str, action: str) -> str:
    return f"/v1/transactions/{quote(transactional_id, safe='')}/{action}"


def group_path(group_id: str, action: str) -> str:
    return f"/v1/groups/{quote(group_id, safe='')}/{action}"


def find_coordinator_params(key: str, key_type: str) -> dict[str, str]:
    return {"key": key, "key_type": key_type}
