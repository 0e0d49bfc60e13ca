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
        self.txn_coordinator: str | None = None
        self._group_nodes: dict[str, str] = {}

    # --- topics --------------------------------------------------------------------------

    def update_topic(self, body: dict[str, Any]) -> None:
        """Store a ``TopicInfo`` answer (``GET /v1/topics/{t}`` or ``POST /v1/topics``)."""
        parts = sorted(body["partitions"], key=lambda p: int(p["partition"]))
        self._leaders[str(body["name"])] = [str(p["leader"]["url"]).rstrip("/") for p in parts]

    def update_metadata(self, body: dict[str, Any]) -> None:
        for topic in body.get("topics", []):
            self.update_topic(topic)

    def partition_count(self, topic: str) -> int | None:
        leaders = self._leaders.get(topic)
        return None if leaders is None else len(leaders)

    def leader(self, tp: TopicPartition) -> str | None:
        leaders = self._leaders.get(tp.topic)
        if leaders is None:
            return None
        if not 0 <= tp.partition < len(leaders):
            raise UnknownTopicOrPartitionError(
                f"{tp.topic} has {len(leaders)} partitions; there is no partition {tp.partition}"
            )
        return leaders[tp.partition]

    def invalidate_topic(self, topic: str) -> None:
        self._leaders.pop(topic, None)

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
