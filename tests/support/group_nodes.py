"""Stand-in storage nodes for the tests of consumer group lag (the console's group pages and
the coordinator's lag gauge), and a consumer group member driven by hand.

``GroupNodes`` answers what a group's lag is read from, from numbers the test sets: a
group's committed offsets (``GET /v1/groups/{g}/offsets``), a partition's bounds
(``GET /v1/partitions/{t}/{p}/offsets``, what ``GET /v1/groups/{id}`` and the lag sampler
ask) and a node's partition list (``GET /v1/partitions``, what the console asks). Every such
call is recorded with the node, its kind and its ``authorization`` header, so a test can
check both what the pages cost and whose token the nodes were shown.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote

import httpx
import orjson

from tests.support.coordinators import INTERNAL_TOKEN, FakeNodes

Key = tuple[str, int]


def _refusal(status: int, code: str, message: str = "") -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message,
                                                  "retriable": False}})


class GroupNodes(FakeNodes):
    """``FakeNodes`` that also create partitions in batches and answer the read calls of
    lag. ``stable`` is each partition's last stable offset (0 when unset), ``committed``
    each group's committed offsets; a group in ``refused`` has its offsets refused
    (GROUP_AUTHORIZATION_FAILED); with ``tokens`` set, a read call without one of them
    as its bearer token is refused (UNAUTHENTICATED), as a node with authentication on
    would."""

    def __init__(self, node_ids: tuple[int, ...] = (1, 2, 3)) -> None:
        super().__init__(node_ids)
        self.stable: dict[Key, int] = {}
        self.committed: dict[str, dict[Key, int]] = {}
        self.refused: set[str] = set()
        self.tokens: set[str] | None = None
        self.calls: list[tuple[int, str, str | None]] = []
        self._calls_lock = threading.Lock()

    def kinds(self) -> dict[str, int]:
        """How many read calls of each kind (``list``, ``bounds``, ``offsets``) so far."""
        with self._calls_lock:
            found: dict[str, int] = {}
            for _, kind, _ in self.calls:
                found[kind] = found.get(kind, 0) + 1
            return found

    def bearers(self) -> set[str | None]:
        with self._calls_lock:
            return {auth for _, _, auth in self.calls}

    def forget_calls(self) -> None:
        with self._calls_lock:
            self.calls.clear()

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        parts = [unquote(p) for p in request.url.raw_path.decode().split("?")[0].split("/")]
        kind = self._kind(request.method, parts)
        if kind is None:
            if request.method == "POST" and request.url.path == "/internal/v1/partitions":
                return self._create(node, request)
            return super()._handle(request)
        auth = request.headers.get("authorization")
        with self._calls_lock:
            self.calls.append((node, kind, auth))
        if node in self.down:
            raise httpx.ConnectError("node is down", request=request)
        if self.tokens is not None and auth not in {f"Bearer {t}" for t in self.tokens}:
            return _refusal(401, "UNAUTHENTICATED", "a bearer token is required")
        if kind == "offsets":
            group = parts[3]
            if group in self.refused:
                return _refusal(403, "GROUP_AUTHORIZATION_FAILED", f"no read on {group}")
            with self._lock:
                done = sorted(self.committed.get(group, {}).items())
            return httpx.Response(200, json={"offsets": [
                {"topic": t, "partition": p, "offset": o, "metadata": ""}
                for (t, p), o in done
            ]})  # fmt: skip
        if kind == "bounds":
            topic, partition = parts[3], int(parts[4])
            with self._lock:
                held = (node, topic, partition) in self.created
            if not held:
                return _refusal(404, "UNKNOWN_TOPIC_OR_PARTITION", f"{topic}/{partition}")
            return httpx.Response(200, json=self._numbers(topic, partition))
        return httpx.Response(200, json=self._listing(node, request.url.params))

    @staticmethod
    def _kind(method: str, parts: list[str]) -> str | None:
        if method != "GET" or parts[:2] != ["", "v1"]:
            return None
        if len(parts) == 5 and parts[2] == "groups" and parts[4] == "offsets":
            return "offsets"
        if len(parts) == 6 and parts[2] == "partitions" and parts[5] == "offsets":
            return "bounds"
        if len(parts) == 3 and parts[2] == "partitions":
            return "list"
        return None

    def _numbers(self, topic: str, partition: int) -> dict[str, int]:
        with self._lock:
            stable = self.stable.get((topic, partition), 0)
        return {"log_start_offset": 0, "high_watermark": stable, "last_stable_offset": stable}

    def _create(self, node: int, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {INTERNAL_TOKEN}":
            return _refusal(401, "UNAUTHENTICATED")
        if node in self.down:
            raise httpx.ConnectError("node is down", request=request)
        entries = orjson.loads(request.content)["partitions"]
        with self._lock:
            for e in entries:
                self.created.add((node, e["topic"], e["partition"]))
        return httpx.Response(200, json={"partitions": [
            {"topic": e["topic"], "partition": e["partition"], "created": True, "error": None}
            for e in entries
        ]})  # fmt: skip

    def _listing(self, node: int, params: httpx.QueryParams) -> dict[str, Any]:
        topic = params.get("topic")
        first = int(params.get("first_partition", 0))
        last = int(params.get("last_partition", 1_000_000))
        with self._lock:
            held = sorted((t, p) for n, t, p in self.created if n == node)
        rows = [
            {"topic": t, "partition": p, "leader": True, "leader_epoch": 0,
             **self._numbers(t, p), "log_end_offset": self._numbers(t, p)["high_watermark"],
             "producer_count": 0}
            for t, p in held if (topic is None or t == topic) and first <= p <= last
        ]  # fmt: skip
        return {"node_id": node, "partitions": rows}


class Member:
    """A group member over HTTP that reads what its last answer assigned and says so."""

    def __init__(self, client: httpx.Client, group: str, topics: list[str]) -> None:
        self.client, self.group = client, group
        answer = self._beat(member_epoch=0, subscribed_topic_names=topics, owned_partitions=[])
        self.member_id: str = answer["member_id"]

    def _beat(self, **body: Any) -> dict[str, Any]:
        answer = self.client.post(f"/v1/groups/{self.group}/heartbeat", json=body)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        self.epoch: int = found["member_epoch"]
        self.reading = sorted((tp["topic"], tp["partition"]) for tp in found["assignment"])
        return found

    def beat(self) -> None:
        self._beat(member_id=self.member_id, member_epoch=self.epoch, owned_partitions=[
            {"topic": t, "partition": p} for t, p in self.reading
        ])  # fmt: skip


def settle(members: list[Member], rounds: int = 4) -> None:
    """Heartbeat every member a few times: revocations acknowledged, partitions handed on."""
    for _ in range(rounds):
        for member in members:
            member.beat()
