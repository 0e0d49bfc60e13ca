"""The topics pages at scale: what they cost the storage nodes, and their bad input.

A real coordinator (in-process, on PostgreSQL, authentication off) whose storage nodes
are ``ListingNodes``: an httpx transport, the seam where every request the coordinator
makes to a node is counted. They create partitions as nodes do and answer the partition
list (``GET /v1/partitions``) with offsets made up from the partition index, so the sums
on the pages can be checked. With 5,000 partitions (five topics of 1,000, the most a topic
may be created with) the topics page asks each node once, a topic's page asks each node
once for that page's range, and no page asks anything per partition.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.support.coordinators import (
    INTERNAL_TOKEN,
    FakeNodes,
    InProcessCoordinator,
    coordinator_settings,
    temp_database,
)

LIST = "/v1/partitions"
TOPICS = [f"big-{i}" for i in range(5)]
PER_TOPIC = 1000


def high_watermark(partition: int) -> int:
    return 10 + partition % 5


def lso_lag(partition: int) -> int:
    return partition % 3


class ListingNodes(FakeNodes):
    """``FakeNodes`` that also create partitions in batches and list them, counting every
    request by node and kind: ``list`` (with its parameters in ``lists``), or
    ``per-partition`` for anything under ``/v1/partitions/{topic}/{p}``."""

    def __init__(self) -> None:
        super().__init__((1, 2, 3))
        self.old: set[int] = set()  # nodes of a release without the list: 404
        self.calls: list[tuple[int, str]] = []
        self.lists: list[tuple[int, dict[str, str]]] = []
        self._calls_lock = threading.Lock()

    def count(self, kind: str) -> dict[int, int]:
        with self._calls_lock:
            found: dict[int, int] = {}
            for node, seen in self.calls:
                if seen == kind:
                    found[node] = found.get(node, 0) + 1
            return found

    def forget_calls(self) -> None:
        with self._calls_lock:
            self.calls.clear()
            self.lists.clear()

    def _handle(self, request: httpx.Request) -> httpx.Response:
        node = int(request.url.host.removeprefix("node").split(".")[0])
        path = request.url.path
        if path == LIST or path.startswith(LIST + "/"):
            with self._calls_lock:
                self.calls.append((node, "list" if path == LIST else "per-partition"))
                if path == LIST:
                    self.lists.append((node, dict(request.url.params)))
            if node in self.down:
                raise httpx.ConnectError("node is down", request=request)
            if path == LIST and request.method == "GET" and node in self.old:
                return httpx.Response(404, json={"error": {
                    "code": "NOT_FOUND", "message": "Not Found", "retriable": False}})
            if path == LIST and request.method == "GET":
                return httpx.Response(200, json=self._listing(node, request.url.params))
        authorized = request.headers.get("authorization") == f"Bearer {INTERNAL_TOKEN}"
        if request.method == "POST" and path == "/internal/v1/partitions" and authorized:
            if node in self.down:
                raise httpx.ConnectError("node is down", request=request)
            entries = orjson.loads(request.content)["partitions"]
            with self._lock:
                for e in entries:
                    self.created.add((node, e["topic"], e["partition"]))
            return httpx.Response(200, json={"partitions": [
                {"topic": e["topic"], "partition": e["partition"], "created": True,
                 "error": None}
                for e in entries
            ]})  # fmt: skip
        return super()._handle(request)

    def _listing(self, node: int, params: httpx.QueryParams) -> dict[str, Any]:
        topic = params.get("topic")
        first = int(params.get("first_partition", 0))
        last = int(params.get("last_partition", 9_999))
        with_producers = params.get("producers") == "true"
        with self._lock:
            held = sorted((t, p) for n, t, p in self.created if n == node)
        rows = []
        for t, p in held:
            if (topic is not None and t != topic) or not first <= p <= last:
                continue
            high = high_watermark(p)
            row: dict[str, Any] = {
                "topic": t, "partition": p, "leader": True, "leader_epoch": 0,
                "log_start_offset": 0, "high_watermark": high,
                "last_stable_offset": high - lso_lag(p), "log_end_offset": high,
                "producer_count": 1,
            }  # fmt: skip
            if with_producers:
                row["producers"] = [{
                    "producer_id": 1000 + p, "producer_epoch": 0, "last_sequence": 0,
                    "slot": 0, "coordinator_epoch": -1,
                    "current_txn_start_offset": high - lso_lag(p) if lso_lag(p) else None,
                    "last_timestamp_ms": 1, "current_txn_start_ms": None,
                }]  # fmt: skip
            rows.append(row)
        return {"node_id": node, "partitions": rows}


@pytest.fixture(scope="module")
def nodes() -> ListingNodes:
    return ListingNodes()


@pytest.fixture(scope="module")
def coordinator(nodes: ListingNodes) -> Iterator[InProcessCoordinator]:
    with temp_database() as url:
        settings = coordinator_settings(url, nodes.spec, group_offset_partitions=50)
        running = InProcessCoordinator(settings, node_transport=nodes.transport,
                                       background=False).start()
        try:
            with running.client(timeout=120) as client:
                for name in TOPICS:
                    body = {"name": name, "partitions": PER_TOPIC}
                    assert client.post("/v1/topics", json=body).status_code == 201
            yield running
        finally:
            running.stop()


@pytest.fixture
def client(coordinator: InProcessCoordinator, nodes: ListingNodes) -> Iterator[httpx.Client]:
    nodes.down.clear()
    nodes.old.clear()
    with coordinator.client(timeout=60) as c:
        nodes.forget_calls()
        yield c


def rows(html: str, table: str) -> dict[str, dict[str, str]]:
    """The rows of table ``table`` by their ``data-topic`` (and ``data-partition``), each
    as its classed cells' text."""
    body = html.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    found = {}
    for attrs, inner in re.findall(r"<tr (data-topic=[^>]*)>(.*?)</tr>", body, re.S):
        key = re.search(r'data-topic="([^"]*)"', attrs).group(1)  # type: ignore[union-attr]
        partition = re.search(r'data-partition="(\d+)"', attrs)
        if partition:
            key += f"/{partition.group(1)}"
        cells = {}
        for classes, text in re.findall(r'<td class="([^"]*)">(.*?)</td>', inner, re.S):
            plain = re.sub(r"<[^>]+>", "", text).strip()
            for name in classes.split():
                cells[name] = plain
        found[key] = cells
    return found


def lag_of(partitions: range) -> int:
    return sum(lso_lag(p) for p in partitions)


def test_the_topics_page_asks_each_node_once_and_hides_internal_topics(
    client: httpx.Client, nodes: ListingNodes
) -> None:
    answer = client.get("/console/topics")
    assert answer.status_code == 200, answer.text
    assert nodes.count("list") == {1: 1, 2: 1, 3: 1}
    assert nodes.count("per-partition") == {}
    assert all(params == {} for _, params in nodes.lists)  # the whole list, once
    shown = rows(answer.text, "topics")
    assert sorted(shown) == TOPICS  # __consumer_offsets hidden
    for name in TOPICS:
        assert shown[name]["partitions"] == str(PER_TOPIC)
        assert shown[name]["replication"] == "1"
        assert shown[name]["offline"] == "0" and shown[name]["under-replicated"] == "0"
        assert shown[name]["lag"] == str(lag_of(range(PER_TOPIC)))
    assert 'href="/console/topics?internal=1"' in answer.text

    nodes.forget_calls()
    answer = client.get("/console/topics?internal=1")
    assert answer.status_code == 200
    shown = rows(answer.text, "topics")
    assert sorted(shown) == ["__consumer_offsets", *TOPICS]
    assert shown["__consumer_offsets"]["partitions"] == "50"
    assert "internal" in answer.text.split('data-topic="__consumer_offsets"', 1)[1][:300]
    assert nodes.count("list") == {1: 1, 2: 1, 3: 1}
    assert nodes.count("per-partition") == {}


def test_a_topic_page_shows_one_page_of_partitions_asking_each_node_once(
    client: httpx.Client, nodes: ListingNodes
) -> None:
    answer = client.get("/console/topics/big-3")
    assert answer.status_code == 200, answer.text
    shown = rows(answer.text, "partitions")
    assert sorted(shown, key=lambda k: int(k.split("/")[1])) == [
        f"big-3/{p}" for p in range(200)
    ]
    assert shown["big-3/7"]["hw"] == str(high_watermark(7))
    assert shown["big-3/7"]["lag"] == str(lso_lag(7))
    assert f"LSO lag {lag_of(range(200))} on this page" in answer.text
    assert 'data-producer-id="1007"' in answer.text  # the producers of the page
    assert nodes.count("list") == {1: 1, 2: 1, 3: 1}
    assert nodes.count("per-partition") == {}
    for _, params in nodes.lists:
        assert params == {"topic": "big-3", "first_partition": "0", "last_partition": "199",
                          "producers": "true"}
    assert 'rel="next" href="/console/topics/big-3?page=2"' in answer.text

    nodes.forget_calls()
    last = client.get("/console/topics/big-3?page=5")
    assert last.status_code == 200
    assert sorted(int(k.split("/")[1]) for k in rows(last.text, "partitions")) == list(
        range(800, 1000)
    )
    assert "Partitions 801\N{EN DASH}1000 of 1000" in last.text
    assert 'rel="next"' not in last.text
    assert {params["first_partition"] for _, params in nodes.lists} == {"800"}
    assert nodes.count("list") == {1: 1, 2: 1, 3: 1}


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/console/topics/big-3?page=6", 404, "no page 6 of topic big-3: it has 5 pages"),
    ("/console/topics/big-3?page=0", 400, "Bad page number"),
    ("/console/topics/big-3?page=-1", 400, "Bad page number"),
    ("/console/topics/big-3?page=two", 400, "Bad page number"),
    ("/console/topics/big-3?page=" + "9" * 5000, 400, "Bad page number"),
    ("/console/topics?page=2", 404, "no page 2 of the topic list: it has 1 page."),
    ("/console/topics?internal=yes", 400, "Bad value"),
    ("/console/topics/nothing-here", 404, "No topic &#39;nothing-here&#39; in this cluster"),
    ("/console/topics/bad%20name", 404, "is 1 to 249 characters"),
    ("/console/topics/%2E%2E", 404, "not a legal topic name"),
])  # fmt: skip
def test_bad_input_answers_a_clear_error_page(
    client: httpx.Client, nodes: ListingNodes, path: str, status: int, says: str
) -> None:
    answer = client.get(path)
    assert answer.status_code == status, answer.text
    assert says in answer.text
    assert 'id="refusal"' in answer.text and 'href="/console/topics"' in answer.text
    assert nodes.count("list") == {}  # refused before any node was asked


def test_a_node_that_is_down_costs_its_rows_their_numbers_not_the_page(
    client: httpx.Client, nodes: ListingNodes, coordinator: InProcessCoordinator
) -> None:
    nodes.down.add(2)
    answer = client.get("/console/topics")
    assert answer.status_code == 200
    led_by_2 = {
        name: [p for p in range(PER_TOPIC)
               if coordinator.services.metadata.cached_leader(name, p) == 2]
        for name in TOPICS
    }  # fmt: skip
    shown = rows(answer.text, "topics")
    for name in TOPICS:
        assert led_by_2[name]
        assert f"({len(led_by_2[name])} partitions unread)" in shown[name]["lag"]
        read = [p for p in range(PER_TOPIC) if p not in led_by_2[name]]
        assert shown[name]["lag"].startswith(f"{sum(lso_lag(p) for p in read)} ")
    errors = answer.text.split('id="node-errors"', 1)[1].split("</ul>", 1)[0]
    assert 'data-node-id="2"' in errors and "unreachable" in errors
    assert nodes.count("list") == {1: 1, 2: 1, 3: 1}  # asked once, not retried per row

    page = client.get("/console/topics/big-0")
    assert page.status_code == 200
    partitions = rows(page.text, "partitions")
    down = next(p for p in led_by_2["big-0"] if p < 200)
    assert partitions[f"big-0/{down}"]["hw"] == "—"
    assert "leader 2: unreachable" in page.text
    up = next(p for p in range(200) if p not in led_by_2["big-0"])
    assert partitions[f"big-0/{up}"]["hw"] == str(high_watermark(up))


def test_a_node_of_an_older_release_is_named_as_such(
    client: httpx.Client, nodes: ListingNodes
) -> None:
    nodes.old.add(3)
    answer = client.get("/console/topics/big-1")
    assert answer.status_code == 200
    errors = answer.text.split('id="node-errors"', 1)[1].split("</ul>", 1)[0]
    assert 'data-node-id="3"' in errors and "a node of an older release" in errors
    assert nodes.count("per-partition") == {}  # no falling back to a request per partition
