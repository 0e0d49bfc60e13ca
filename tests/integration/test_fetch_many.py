"""A consumer reads many partitions of a node in one request (``POST /v1/fetch``,
docs/design.md §4), on a real cluster: one coordinator and three storage nodes, every
partition on all three.

Shown here: one request mixing read_committed and read_uncommitted partitions answers
each as the one-partition fetch would (the committed reader stops at the last stable
offset of an open transaction and never sees an aborted one); a partition the node does
not have, does not lead or is asked past its log carries its own error beside the others'
records, and so does a topic the caller may not read (on a cluster with authentication);
a request with nothing to read waits out ``max_wait_ms`` and one that gets a record
meanwhile answers at once; refused bodies are refused whole; the total ``max_bytes``
bounds the answer; and the SDK's consumer reads a topic spread over the three nodes
exactly once, with one request per node per round.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from sdk import (
    AsyncConsumer,
    Consumer,
    TopicAuthorizationFailedError,
    TopicPartition,
    TransactionalProducer,
)
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

TOPIC = "mixed"
PARTITIONS = 27  # nine led by each node
WIDE = "wide"
WIDE_PARTITIONS = 24


def _create(cluster: Cluster, name: str, partitions: int) -> None:
    answer = httpx.post(f"{cluster.url}/v1/topics", timeout=120, json={
        "name": name, "partitions": partitions, "replication_factor": 3})  # fmt: skip
    assert answer.status_code == 201, answer.text

    def whole() -> bool:
        states = httpx.get(f"{cluster.url}/v1/topics/{name}", timeout=10).json()["partitions"]
        return all(s["leader"]["node_id"] != -1 and len(s["isr"]) == 3 for s in states)

    wait_until(whole, timeout=60, what=f"every partition of {name} led, all replicas in sync")


def leaders(cluster: Cluster, name: str) -> dict[int, str]:
    """Partition -> its leader's URL."""
    states = httpx.get(f"{cluster.url}/v1/topics/{name}", timeout=10).json()["partitions"]
    return {s["partition"]: s["leader"]["url"].rstrip("/") for s in states}


class Layout:
    """The partitions of the mixed topic the tests use: on the node ``url``, four with an
    aborted transaction (``aborted_*``) or an open one (``open_*``), to be read committed
    (``*_rc``) or not (``*_ru``), two left empty (``idle``, ``wait``) and three more for
    the byte limit; and one partition led by another node (``elsewhere``)."""

    def __init__(self, cluster: Cluster) -> None:
        led = leaders(cluster, TOPIC)
        by_node: dict[str, list[int]] = {}
        for partition, url in sorted(led.items()):
            by_node.setdefault(url, []).append(partition)
        self.url, mine = max(by_node.items(), key=lambda item: len(item[1]))
        assert len(mine) >= 9, by_node
        self.aborted_rc, self.aborted_ru, self.open_rc, self.open_ru, self.idle, self.wait = (
            mine[:6]
        )
        self.elsewhere = next(p for p, url in led.items() if url != self.url)


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Cluster:
    cluster = module_cluster_factory(nodes=3)
    _create(cluster, TOPIC, PARTITIONS)
    return cluster


@pytest.fixture(scope="module")
def layout(cluster: Cluster) -> Iterator[Layout]:
    """Committed c0 c1; then aborted a0 a1 (the ``aborted_*`` partitions); then committed
    c2; then, in the ``open_*`` partitions, o0 o1 of a transaction left open."""
    where = Layout(cluster)
    four = [where.aborted_rc, where.aborted_ru, where.open_rc, where.open_ru]
    writer = TransactionalProducer(cluster.url, "fetch-many-writer")
    writer.init_transactions()
    for values, partitions, commit in (
        (["c0", "c1"], four, True),
        (["a0", "a1"], four[:2], False),
        (["c2"], four, True),
    ):
        writer.begin_transaction()
        for p in partitions:
            for value in values:
                writer.send(TOPIC, value, partition=p)
        writer.flush()
        if commit:
            writer.commit_transaction()
        else:
            writer.abort_transaction()
    writer.close()
    holder = TransactionalProducer(cluster.url, "fetch-many-open", transaction_timeout_ms=600_000)
    holder.init_transactions()
    holder.begin_transaction()
    for p in four[2:]:
        for value in ("o0", "o1"):
            holder.send(TOPIC, value, partition=p)
    holder.flush()
    try:
        yield where
    finally:
        holder.abort_transaction()
        holder.close()


def fetch(url: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/fetch", json=body, timeout=60, **kwargs)


def values(entry: dict[str, Any]) -> list[str]:
    return [r["value"] for r in entry["records"]]


def test_one_request_reads_committed_and_uncommitted_partitions(
    cluster: Cluster, layout: Layout
) -> None:
    entry = {"topic": TOPIC, "offset": 0}
    body: dict[str, Any] = {"isolation_level": "read_committed", "partitions": [
        {**entry, "partition": layout.aborted_rc},
        {**entry, "partition": layout.aborted_ru, "isolation_level": "read_uncommitted"},
        {**entry, "partition": layout.open_rc},
        {**entry, "partition": layout.open_ru, "isolation_level": "read_uncommitted"},
    ]}  # fmt: skip
    answer = fetch(layout.url, body)
    assert answer.status_code == 200, answer.text
    aborted_rc, aborted_ru, open_rc, open_ru = answer.json()["partitions"]
    assert [(e["topic"], e["partition"]) for e in (aborted_rc, aborted_ru, open_rc, open_ru)] == [
        (TOPIC, p["partition"]) for p in body["partitions"]
    ]
    assert values(aborted_rc) == ["c0", "c1", "c2"]  # the aborted records left out
    assert values(aborted_ru) == ["c0", "c1", "a0", "a1", "c2"]
    assert values(open_rc) == ["c0", "c1", "c2"]  # and nothing from the open transaction
    assert values(open_ru) == ["c0", "c1", "c2", "o0", "o1"]
    assert open_rc["last_stable_offset"] < open_rc["high_watermark"]
    assert open_rc["next_offset"] == open_rc["last_stable_offset"]  # stops at the LSO
    assert aborted_rc["next_offset"] == aborted_rc["high_watermark"]  # past the markers
    assert all(e["error"] is None for e in (aborted_rc, aborted_ru, open_rc, open_ru))
    # each partition as the one-partition fetch answers it
    for asked, got in zip(body["partitions"], answer.json()["partitions"], strict=True):
        level = asked.get("isolation_level", "read_committed")
        single = httpx.get(f"{layout.url}/v1/partitions/{TOPIC}/{asked['partition']}/records",
                           params={"offset": 0, "isolation_level": level}, timeout=30)  # fmt: skip
        assert single.status_code == 200, single.text
        assert {k: v for k, v in got.items() if k not in ("topic", "partition", "error")} == (
            single.json()
        )


def test_each_refused_partition_carries_its_own_error(cluster: Cluster, layout: Layout) -> None:
    body: dict[str, Any] = {"max_wait_ms": 20_000, "partitions": [
        {"topic": "absent", "partition": 0, "offset": 0},
        {"topic": TOPIC, "partition": layout.aborted_ru, "offset": 0},
        {"topic": TOPIC, "partition": layout.elsewhere, "offset": 0},
        {"topic": TOPIC, "partition": layout.open_ru, "offset": 1_000_000},
    ]}  # fmt: skip
    started = time.monotonic()
    answer = fetch(layout.url, body)
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - started < 10, "an answer with errors waits for nothing"
    unknown, read, not_led, out_of_range = answer.json()["partitions"]
    assert unknown["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert not_led["error"] == {**not_led["error"], "code": "NOT_LEADER_OR_FOLLOWER",
                                "retriable": True}  # fmt: skip
    assert out_of_range["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    assert out_of_range["log_start_offset"] == 0 and out_of_range["high_watermark"] > 0
    for refused, asked in ((unknown, 0), (not_led, 0), (out_of_range, 1_000_000)):
        assert refused["records"] == [] and refused["next_offset"] == asked
    assert read["error"] is None and values(read) == ["c0", "c1", "a0", "a1", "c2"]


def test_a_topic_the_caller_may_not_read_is_refused_alone(
    cluster_factory: ClusterFactory,
) -> None:
    secure = cluster_factory(nodes=1, auth=True)
    with secure.client("admin") as admin:
        for name in ("readable", "secret"):
            assert admin.post("/v1/topics", json={"name": name, "partitions": 2}
                              ).status_code == 201  # fmt: skip
        assert admin.post("/v1/acls", json={"acls": [{
            "principal": "User:reader", "resource_type": "topic", "resource_name": "readable",
            "pattern_type": "literal", "operation": "read", "permission": "allow"}]}
        ).status_code == 201  # fmt: skip
        node = admin.get("/v1/topics/readable").json()["partitions"][0]["leader"]["url"]
        for name in ("readable", "secret"):
            assert admin.post(f"{node}/v1/partitions/{name}/0/records",
                              json={"records": [{"value": name}]}).status_code == 200
    body = {"partitions": [{"topic": t, "partition": p, "offset": 0}
                           for t in ("secret", "readable") for p in (0, 1)]}  # fmt: skip
    with secure.client("reader", node) as reader:
        wait_until(lambda: reader.post("/v1/fetch", json=body).status_code == 200, timeout=20,
                   what="the node to know the reader's rights")  # fmt: skip
        answer = reader.post("/v1/fetch", json=body).json()["partitions"]
    assert [e["error"] and e["error"]["code"] for e in answer] == [
        "TOPIC_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED", None, None]
    assert values(answer[2]) == ["readable"] and answer[3]["records"] == []
    with secure.client(None, node) as anonymous:
        refused = anonymous.post("/v1/fetch", json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
    # the consumer gives the application the refusal, as a fetch of that partition alone did
    with Consumer(secure.url, token=secure.tokens["reader"]) as consumer:
        consumer.assign([("readable", 0), ("secret", 0)])
        for tp in consumer.assignment():
            consumer.seek(tp, 0)  # no offsets to look up: the fetch meets the refusal
        with pytest.raises(TopicAuthorizationFailedError):
            _poll_until(lambda: consumer.poll(timeout=0.5), lambda _got: False, 20)


def test_nothing_to_read_waits_out_max_wait(cluster: Cluster, layout: Layout) -> None:
    end = leaders_offsets(layout.url, layout.idle)["high_watermark"]
    body = {"max_wait_ms": 1_000, "partitions": [
        {"topic": TOPIC, "partition": layout.idle, "offset": end}]}  # fmt: skip
    started = time.monotonic()
    answer = fetch(layout.url, body)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    [entry] = answer.json()["partitions"]
    assert entry["records"] == [] and entry["next_offset"] == end and entry["error"] is None
    assert 0.9 <= took < 5, f"answered after {took:.2f}s, asked to wait 1s"


def leaders_offsets(url: str, partition: int) -> dict[str, int]:
    answer = httpx.get(f"{url}/v1/partitions/{TOPIC}/{partition}/offsets", timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _when_sent(done: threading.Event) -> dict[str, Callable[[str, dict[str, Any]], None]]:
    """httpx's trace hook: ``done`` is set once the request's body is on the wire."""

    def trace(event: str, _info: dict[str, Any]) -> None:
        if event == "http11.send_request_body.complete":
            done.set()

    return {"trace": trace}


def test_a_record_produced_meanwhile_ends_the_wait(cluster: Cluster, layout: Layout) -> None:
    end = leaders_offsets(layout.url, layout.wait)["high_watermark"]
    body = {"max_wait_ms": 30_000, "min_bytes": 1, "partitions": [
        {"topic": TOPIC, "partition": layout.idle, "offset": leaders_offsets(
            layout.url, layout.idle)["high_watermark"]},
        {"topic": TOPIC, "partition": layout.wait, "offset": end},
    ]}  # fmt: skip
    sent = threading.Event()
    result: dict[str, Any] = {}

    def ask() -> None:
        started = time.monotonic()
        try:
            with httpx.Client(timeout=60) as client:
                result["answer"] = client.post(f"{layout.url}/v1/fetch", json=body,
                                               extensions=_when_sent(sent))  # fmt: skip
        finally:
            result["took"] = time.monotonic() - started
            sent.set()  # a request that failed before its body left ends the wait too

    asker = threading.Thread(target=ask)
    asker.start()
    assert sent.wait(30), "the fetch was never sent"
    produced = httpx.post(f"{layout.url}/v1/partitions/{TOPIC}/{layout.wait}/records",
                          json={"records": [{"value": "wake up"}]}, timeout=30)  # fmt: skip
    assert produced.status_code == 200, produced.text
    asker.join(40)
    answer = result["answer"]
    assert answer.status_code == 200, answer.text
    idle, woken = answer.json()["partitions"]
    assert values(woken) == ["wake up"] and woken["next_offset"] == end + 1
    assert idle["records"] == []
    assert result["took"] < 10, f"answered after {result['took']:.1f}s of a 30s wait"


def _fetched_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^eos_node_fetched_records_total\{.*\} (\S+)$",
                                            text, re.MULTILINE))  # fmt: skip


@pytest.mark.parametrize("partitions", ["twice", "none"])
def test_a_bad_request_is_refused_whole(cluster: Cluster, layout: Layout, partitions: str) -> None:
    one = {"topic": TOPIC, "partition": layout.aborted_ru, "offset": 0}
    body = {"partitions": [one, {"topic": TOPIC, "partition": layout.idle, "offset": 0}, one]
            if partitions == "twice" else []}  # fmt: skip
    before = _fetched_total(layout.url), leaders_offsets(layout.url, layout.aborted_ru)
    answer = fetch(layout.url, body)
    assert answer.status_code == 422, answer.text  # schema validation, as everywhere
    error = answer.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and error["retriable"] is False
    if partitions == "twice":
        assert f"{TOPIC}/{layout.aborted_ru} is named twice" in error["message"]
    assert (_fetched_total(layout.url), leaders_offsets(layout.url, layout.aborted_ru)) == before


def test_max_bytes_bounds_the_whole_answer(cluster: Cluster, layout: Layout) -> None:
    led = [p for p, url in leaders(cluster, TOPIC).items() if url == layout.url][6:9]
    assert len(led) == 3
    for p in led:
        sent = httpx.post(f"{layout.url}/v1/partitions/{TOPIC}/{p}/records", timeout=30, json={
            "records": [{"value": f"{p}-{i}-" + "x" * 1_000} for i in range(5)]})  # fmt: skip
        assert sent.status_code == 200, sent.text

    def asked(max_bytes: int) -> list[dict[str, Any]]:
        answer = fetch(layout.url, {"max_bytes": max_bytes, "partitions": [
            {"topic": TOPIC, "partition": p, "offset": 0} for p in led]})  # fmt: skip
        assert answer.status_code == 200, answer.text
        return list(answer.json()["partitions"])

    def size(entries: list[dict[str, Any]]) -> int:
        """The bytes the limit counts: each partition's records as JSON."""
        return sum(len(orjson.dumps(e["records"])) - 2 for e in entries)

    everything = asked(64 * 1024 * 1024)
    assert [len(e["records"]) for e in everything] == [5, 5, 5]
    capped = asked(3_500)
    assert 1 <= sum(len(e["records"]) for e in capped) < 15
    assert size(capped) <= 3_500
    for entry in capped:  # each stops where its records stop, to be asked again from there
        records = entry["records"]
        assert entry["next_offset"] == (records[-1]["offset"] + 1 if records else 0)
    one = asked(1)  # smaller than any record: the first partition still gets one
    assert [len(e["records"]) for e in one] == [1, 0, 0]


# --- the SDK's consumer ------------------------------------------------------------------


class Requests:
    """The consumer's requests to the storage nodes, by node and kind, and the partitions
    each fetch named."""

    def __init__(self) -> None:
        self.count: Counter[tuple[str, str]] = Counter()
        self.named: list[tuple[str, list[int]]] = []

    def saw(self, request: httpx.Request) -> None:
        node = f"{request.url.scheme}://{request.url.netloc.decode()}"
        if request.method == "POST" and request.url.path == "/v1/fetch":
            self.count[(node, "fetch-many")] += 1
            partitions = orjson.loads(request.content)["partitions"]
            self.named.append((node, [p["partition"] for p in partitions]))
        elif request.method == "GET" and request.url.path.endswith("/records"):
            self.count[(node, "fetch-one")] += 1

    def of(self, kind: str) -> Counter[str]:
        return Counter({node: n for (node, k), n in self.count.items() if k == kind})


class Counting(httpx.HTTPTransport):
    def __init__(self, requests: Requests) -> None:
        super().__init__()
        self.requests = requests

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.saw(request)
        return super().handle_request(request)


class AsyncCounting(httpx.AsyncHTTPTransport):
    def __init__(self, requests: Requests) -> None:
        super().__init__()
        self.requests = requests

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.saw(request)
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def wide(cluster: Cluster) -> dict[int, list[str]]:
    """A topic of 24 partitions over the three nodes: committed records in every one, and
    an aborted transaction in between."""
    _create(cluster, WIDE, WIDE_PARTITIONS)
    committed: dict[int, list[str]] = {p: [] for p in range(WIDE_PARTITIONS)}
    writer = TransactionalProducer(cluster.url, "fetch-many-wide")
    writer.init_transactions()
    for txn in range(3):
        writer.begin_transaction()
        for p in range(WIDE_PARTITIONS):
            for i in range(20):
                writer.send(WIDE, f"t{txn}-p{p}-{i}", partition=p)
        writer.flush()
        if txn == 1:
            writer.abort_transaction()
        else:
            writer.commit_transaction()
            for p in range(WIDE_PARTITIONS):
                committed[p] += [f"t{txn}-p{p}-{i}" for i in range(20)]
    writer.close()
    return committed


def _poll_until(poll: Callable[[], list[Any]], done: Callable[[list[Any]], bool],
                seconds: float) -> tuple[list[Any], int]:
    """Poll until ``done(records)`` or ``seconds`` have passed; the records and the polls."""
    got: list[Any] = []
    polls = 0
    deadline = time.monotonic() + seconds
    while not done(got) and time.monotonic() < deadline:
        got += poll()
        polls += 1
    return got, polls


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_consumer_reads_every_node_with_one_request_per_round(
    cluster: Cluster, wide: dict[int, list[str]], flavour: str
) -> None:
    """Every committed record once (no aborted one), in one ``POST /v1/fetch`` per node and
    round: never a per-partition fetch, each fetch naming only partitions its node leads,
    and at most three per node in a poll (a poll makes up to three rounds: one that waits
    for nothing, then long polls), where one request per partition would be eight."""
    expected = sorted(v for vs in wide.values() for v in vs)
    requests = Requests()
    tps = [TopicPartition(WIDE, p) for p in range(WIDE_PARTITIONS)]
    loop = asyncio.new_event_loop()
    if flavour == "sync":
        consumer = Consumer(cluster.url, max_poll_records=100, transport=Counting(requests))
        consumer.assign(tps)

        def poll() -> list[Any]:
            return consumer.poll(timeout=0.5)

        close = consumer.close
    else:
        aconsumer = AsyncConsumer(cluster.url, max_poll_records=100,
                                  transport=AsyncCounting(requests))  # fmt: skip
        aconsumer.assign(tps)

        def poll() -> list[Any]:
            return loop.run_until_complete(aconsumer.poll(timeout=0.5))

        def close() -> None:
            loop.run_until_complete(aconsumer.close())

    try:
        got, polls = _poll_until(poll, lambda got: len(got) >= len(expected), 60)
        busy = requests.of("fetch-many")
        idle_got, idle_polls = _poll_until(poll, lambda _got: False, 3)
    finally:
        close()
        loop.close()
    assert sorted(r.value for r in got) == expected
    assert Counter(r.partition for r in got) == Counter({p: len(v) for p, v in wide.items()})
    assert idle_got == []
    led = leaders(cluster, WIDE)
    assert requests.of("fetch-one") == Counter()
    for node, partitions in requests.named:
        assert {led[p] for p in partitions} == {node}
    assert set(busy) == set(led.values())
    for node, count in busy.items():
        assert count <= 3 * polls, f"{node}: {count} fetches in {polls} polls"
    for node, count in requests.of("fetch-many").items():
        idle = count - busy[node]
        assert idle <= 3 * idle_polls, f"{node}: {idle} fetches in {idle_polls} idle polls"
