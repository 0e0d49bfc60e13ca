"""The admin client's group calls against a scripted coordinator pair (``MockTransport``):
where each request goes and which failures are retried.

Deleting a group and resetting its offsets go to the group's coordinator: found once with
``key_type=consumer_group``, kept in the client's metadata cache (as a consumer keeps it
for its heartbeats), and followed to the owner a ``NOT_COORDINATOR`` names. Both are
retried after a lost answer; a delete whose retry finds the group gone counts as done,
unless no earlier attempt can have reached the coordinator (its connection was refused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from sdk import (
    AdminClient,
    AsyncAdminClient,
    GroupIdNotFoundError,
    NonEmptyGroupError,
    RetryConfig,
)

pytestmark = pytest.mark.unit

ENTRY, OWNER = "http://c1", "http://c2"
FAST = RetryConfig(backoff_ms=1, backoff_max_ms=2, fast_backoff_ms=1, request_timeout_ms=1000)
Script = Callable[[httpx.Request], httpx.Response | None]


def _error(status: int, code: str, **details: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": code.lower(),
                                                  "details": details}})  # fmt: skip


class Coordinators:
    """Two coordinators: the entry one names ``ENTRY`` as the group's coordinator (stale:
    the group is ``OWNER``'s), and the entry one answers ``NOT_COORDINATOR`` pointing
    there. ``script`` may answer group calls first (None: fall through)."""

    def __init__(self, script: Script | None = None) -> None:
        self.seen: list[str] = []  # "METHOD host path"
        self.bodies: list[Any] = []  # of the requests that reached the owner
        self.script = script

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, host = request.url.path, f"{request.url.scheme}://{request.url.host}"
        self.seen.append(f"{request.method} {host} {path}")
        if request.content and host == OWNER:
            self.bodies.append(orjson.loads(request.content))
        if path == "/v1/metadata":
            return httpx.Response(200, json={"cluster_id": "c", "nodes": [], "topics": []})
        if path == "/v1/coordinators":
            assert request.url.params["key_type"] == "consumer_group"
            return httpx.Response(200, json={"key": request.url.params["key"],
                                             "key_type": "consumer_group", "node_id": 0,
                                             "url": ENTRY})  # fmt: skip
        answer = self.script(request) if self.script is not None else None
        if answer is not None:
            return answer
        if host == ENTRY and path.startswith("/v1/groups/g"):
            return _error(503, "NOT_COORDINATOR", coordinator_url=OWNER + "/")
        if path == "/v1/groups/g/offsets/reset":
            return httpx.Response(200, json={"offsets": [
                {"topic": "t", "partition": 0, "offset": 3}]})  # fmt: skip
        if path == "/v1/groups/g" and request.method == "DELETE":
            return httpx.Response(200, json={})
        return _error(404, "NOT_FOUND")

    def calls(self, method: str) -> list[str]:
        return [s for s in self.seen if s.startswith(method + " ")]


def _admin(handler: Coordinators) -> AdminClient:
    return AdminClient(ENTRY, retry=FAST, transport=httpx.MockTransport(handler))


def test_delete_and_reset_follow_not_coordinator_and_share_the_owner() -> None:
    handler = Coordinators()
    with _admin(handler) as admin:
        admin.delete_group("g")
        offsets = admin.reset_group_offsets("g", "t", to_offset=3)
    assert [(o.topic, o.partition, o.offset) for o in offsets] == [("t", 0, 3)]
    assert handler.calls("DELETE") == [f"DELETE {ENTRY} /v1/groups/g",
                                       f"DELETE {OWNER} /v1/groups/g"]  # fmt: skip
    # the owner is remembered: the reset goes there at once, nothing is looked up again
    assert handler.calls("POST") == [f"POST {OWNER} /v1/groups/g/offsets/reset"]
    assert handler.seen.count(f"GET {ENTRY} /v1/coordinators") == 1
    assert handler.bodies == [{"topics": ["t"], "to_offset": 3}]


def test_a_delete_retried_after_a_lost_answer_that_finds_the_group_gone_is_done() -> None:
    answers = iter(["lost", "gone"])

    def script(request: httpx.Request) -> httpx.Response | None:
        if request.method != "DELETE":
            return None
        if next(answers) == "lost":  # applied, but the answer never came back
            raise httpx.ReadTimeout("lost", request=request)
        return _error(404, "GROUP_ID_NOT_FOUND")

    handler = Coordinators(script)
    with _admin(handler) as admin:
        admin.delete_group("g")
    assert len(handler.calls("DELETE")) == 2
    assert handler.seen.count(f"GET {ENTRY} /v1/coordinators") == 2  # found again after it


def test_a_delete_never_sent_does_not_hide_a_missing_group() -> None:
    answers = iter(["refused", "gone"])

    def script(request: httpx.Request) -> httpx.Response | None:
        if request.method != "DELETE":
            return None
        if next(answers) == "refused":
            raise httpx.ConnectError("refused", request=request)
        return _error(404, "GROUP_ID_NOT_FOUND")

    with _admin(Coordinators(script)) as admin, pytest.raises(GroupIdNotFoundError):
        admin.delete_group("g")


def test_refusals_are_not_retried() -> None:
    def script(request: httpx.Request) -> httpx.Response | None:
        if request.url.path.startswith("/v1/groups/g"):
            return _error(409, "NON_EMPTY_GROUP")
        return None

    handler = Coordinators(script)
    with _admin(handler) as admin:
        with pytest.raises(NonEmptyGroupError):
            admin.delete_group("g")
        with pytest.raises(NonEmptyGroupError):
            admin.reset_group_offsets("g", ["t"], to_earliest=True)
    assert len(handler.calls("DELETE")) == len(handler.calls("POST")) == 1


@pytest.mark.parametrize(
    "targets",
    [{}, {"to_earliest": True, "to_latest": True}, {"to_offset": 1, "to_timestamp_ms": 5}],
)
def test_a_reset_needs_exactly_one_target_before_anything_is_sent(
    targets: dict[str, Any],
) -> None:
    handler = Coordinators()
    with _admin(handler) as admin, pytest.raises(ValueError, match="exactly one"):
        admin.reset_group_offsets("g", ["t"], **targets)
    assert handler.seen == []


def test_reset_sends_only_the_target_given() -> None:
    handler = Coordinators()
    with _admin(handler) as admin:
        admin.reset_group_offsets("g", ["t", "u"], to_earliest=True)
        admin.reset_group_offsets("g", ("t",), to_timestamp_ms=0)
        admin.reset_group_offsets("g", "t", to_offset=0)
    assert handler.bodies == [
        {"topics": ["t", "u"], "to_earliest": True},
        {"topics": ["t"], "to_timestamp_ms": 0},
        {"topics": ["t"], "to_offset": 0},
    ]


def test_list_and_describe_ask_any_instance() -> None:
    described = {"group_id": "a/b", "state": "empty", "group_epoch": 2, "assignment_epoch": 2,
                 "members": [], "lag": [], "lag_error": "node 2 did not answer"}
    lags: list[str] = []

    def script(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/v1/groups":
            return httpx.Response(200, json={"groups": [
                {"group_id": "a/b", "state": "empty", "members": 0, "group_epoch": 2}]})
        if request.url.raw_path.startswith(b"/v1/groups/a%2Fb"):
            lags.append(request.url.params["lag"])
            return httpx.Response(200, json=described)
        return None

    handler = Coordinators(script)
    with _admin(handler) as admin:
        [listed] = admin.list_groups()
        found = admin.describe_group("a/b")
        admin.describe_group("a/b", lag=False)
    assert (listed.group_id, listed.state, listed.members) == ("a/b", "empty", 0)
    assert found.lag_error == "node 2 did not answer" and found.members == []
    assert lags == ["true", "false"]
    assert all(ENTRY in s for s in handler.seen)
    assert not [s for s in handler.seen if "/v1/coordinators" in s]


def test_the_async_twin_follows_the_owner_too() -> None:
    handler = Coordinators()

    async def run() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncAdminClient(ENTRY, retry=FAST, transport=transport) as admin:
            await admin.reset_group_offsets("g", ["t"], to_latest=True)
            await admin.delete_group("g")

    asyncio.run(run())
    assert handler.calls("POST") == [f"POST {ENTRY} /v1/groups/g/offsets/reset",
                                     f"POST {OWNER} /v1/groups/g/offsets/reset"]  # fmt: skip
    assert handler.calls("DELETE") == [f"DELETE {OWNER} /v1/groups/g"]
