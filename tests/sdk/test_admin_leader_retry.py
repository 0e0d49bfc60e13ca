"""The admin client's partition calls ride out a partition with no live leader for the
moment (a cluster restarting, an election under way): ``LEADER_NOT_AVAILABLE`` is looked
up again within the call's timeout, as Kafka's admin client does, and fails only after."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from eos_protocol.errors import LeaderNotAvailableError
from sdk import AdminClient, RetryConfig

pytestmark = pytest.mark.unit

URL = "http://coordinator"
NODE = "http://node"
FAST = RetryConfig(backoff_ms=1, backoff_max_ms=2, fast_backoff_ms=1, request_timeout_ms=1000)
OFFSETS = {"log_start_offset": 0, "high_watermark": 5, "last_stable_offset": 5}


def _cluster(leaderless_answers: int) -> tuple[httpx.MockTransport, list[str]]:
    """A coordinator whose topic ``t`` has no live leader for its first
    ``leaderless_answers`` descriptions, then node ``NODE``."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        seen.append(path)
        if path == "/v1/metadata":
            return httpx.Response(200, json={"cluster_id": "c", "nodes": [], "topics": []})
        if path == "/v1/topics/t":
            described = seen.count(path)
            url = "" if described <= leaderless_answers else NODE
            partition: dict[str, Any] = {"partition": 0, "leader": {"node_id": 1, "url": url}}
            return httpx.Response(200, json={"name": "t", "partitions": [partition]})
        if path == "/v1/partitions/t/0/offsets":
            return httpx.Response(200, json=OFFSETS)
        return httpx.Response(404, json={"error": {"code": "NOT_FOUND", "message": path}})

    return httpx.MockTransport(handle), seen


def test_list_offsets_waits_out_a_leaderless_moment() -> None:
    transport, seen = _cluster(leaderless_answers=2)
    with AdminClient(URL, retry=FAST, transport=transport) as admin:
        offsets = admin.list_offsets(("t", 0))
    assert offsets.last_stable_offset == 5
    assert seen.count("/v1/topics/t") == 3  # looked up again until a leader was there


def test_list_offsets_fails_once_its_timeout_runs_out() -> None:
    transport, seen = _cluster(leaderless_answers=10**9)
    with (
        AdminClient(URL, retry=FAST, transport=transport) as admin,
        pytest.raises(LeaderNotAvailableError),
    ):
        admin.list_offsets(("t", 0), timeout=0.3)
    assert seen.count("/v1/topics/t") > 1
    assert "/v1/partitions/t/0/offsets" not in seen
