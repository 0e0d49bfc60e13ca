"""Bad input against both services: hand-written nasty requests.

Generated requests (schemathesis, from each service's own ``/openapi.json``) are sent by
``tests/openapi/test_conformance.py``, which holds every answer to the same rule as these:
``tests/support/envelope.py``'s — no 5xx other than a retriable 503, and every error in the
envelope ``{"error": {"code", "message", "retriable"}}`` with a code of the catalogue
(``eos_protocol/errors.py``), its status and its ``retriable`` flag. The nasty inputs
(oversized bodies, invalid UTF-8 and base64, huge headers, negative and enormous numbers,
unknown enum values) must each be refused *and change nothing*: the cluster's observable
state is read back before and after.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from sdk import Producer, TransactionalProducer
from tests.chaos.cluster import chaos_spec
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.envelope import envelope_problems
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

MAX_REQUEST_BYTES = 1 << 20
MAX_RECORD_BYTES = 64 * 1024
INTERNAL = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}


@dataclass
class Target:
    """The cluster under attack and the state it must keep: a topic with records on both
    nodes, a committed transaction and a group's committed offset."""

    cluster: Cluster
    topic: str = field(default_factory=lambda: f"bad-{uuid.uuid4().hex[:8]}")
    tid: str = field(default_factory=lambda: f"bad-tx-{uuid.uuid4().hex[:8]}")
    group: str = field(default_factory=lambda: f"bad-g-{uuid.uuid4().hex[:8]}")

    @property
    def coordinator(self) -> str:
        return self.cluster.bootstrap()

    def leader(self, partition: int) -> str:
        topic = httpx.get(f"{self.coordinator}/v1/topics/{self.topic}", timeout=10).json()
        return str(topic["partitions"][partition]["leader"]["url"])

    def state(self) -> dict[str, Any]:
        """Everything a refused request must leave as it was."""
        get = httpx.Client(timeout=10)
        found: dict[str, Any] = {
            "metadata": get.get(f"{self.coordinator}/v1/metadata").json(),
            "transactions": get.get(f"{self.coordinator}/v1/transactions").json(),
        }
        for p in (0, 1):
            base = f"{self.leader(p)}/v1/partitions/{self.topic}/{p}"
            found[f"offsets {p}"] = get.get(f"{base}/offsets").json()
            found[f"producers {p}"] = get.get(f"{base}/producers").json()
            found[f"records {p}"] = get.get(
                f"{base}/records", params={"offset": 0, "isolation_level": "read_uncommitted"}
            ).json()
        group_node = get.get(
            f"{self.coordinator}/v1/coordinators", params={"key": self.group, "key_type": "group"}
        ).json()["url"]
        found["group"] = get.get(f"{group_node}/v1/groups/{self.group}/offsets").json()
        get.close()
        return found


@pytest.fixture(scope="module")
def target(module_cluster_factory: ClusterFactory) -> Target:
    spec = chaos_spec(
        database="postgres",
        node_flags=(
            "--max-request-bytes", str(MAX_REQUEST_BYTES),
            "--max-record-bytes", str(MAX_RECORD_BYTES),
        ),
    )  # fmt: skip
    made = Target(module_cluster_factory(spec))
    url = made.coordinator
    httpx.post(f"{url}/v1/topics", json={"name": made.topic, "partitions": 2}, timeout=10)
    with Producer(url) as producer:
        for i in range(6):
            producer.send(made.topic, f"plain-{i}", partition=i % 2)
    with TransactionalProducer(url, made.tid) as txn:
        txn.init_transactions()
        with txn.transaction():
            txn.send(made.topic, "committed", partition=0)
            txn.send_offsets_to_transaction({(made.topic, 0): 3}, made.group)
    # the commit answers at PrepareCommit: the state each test compares is the settled one,
    # after the markers and CompleteCommit (a listing taken before shows a growing duration)
    wait_until(
        lambda: _states(url) == ["CompleteCommit"], what="the fixture's commit to complete"
    )
    return made


def _states(coordinator: str) -> list[str]:
    listing = httpx.get(f"{coordinator}/v1/transactions", timeout=10).json()
    return [str(t["state"]) for t in listing["transactions"]]


@pytest.mark.unit
def test_the_envelope_rules_catch_what_they_must() -> None:
    """The checks below are only as good as this function: it must object."""
    assert envelope_problems(
        500, b'{"error":{"code":"INTERNAL_ERROR","message":"","retriable":false}}'
    )
    assert envelope_problems(400, b"Bad Request")
    assert envelope_problems(409, b'{"error":{"code":"NOPE","message":"","retriable":false}}')
    assert envelope_problems(
        503, b'{"error":{"code":"NOT_COORDINATOR","message":"","retriable":false}}'
    )
    assert not envelope_problems(
        503, b'{"error":{"code":"NOT_COORDINATOR","message":"m","retriable":true}}'
    )


@dataclass(frozen=True)
class Nasty:
    """One hand-written bad request: where it goes, and the statuses it may get."""

    name: str
    service: str  # "coordinator" or "node" (the leader of partition 0)
    method: str
    path: str
    statuses: tuple[int, ...]
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _produce(**body: Any) -> dict[str, Any]:
    return {"records": [{"value": "x"}], **body}


TOPIC = "{topic}"
RECORDS = f"/v1/partitions/{TOPIC}/0/records"
NASTY = [
    # invalid UTF-8
    Nasty("utf8 body", "coordinator", "POST", "/v1/topics", (400,),
          content=b'{"name":"\xff\xfe","partitions":1}'),
    Nasty("utf8 produce", "node", "POST", RECORDS, (400,),
          content=b'{"records":[{"value":"\xc3\x28"}]}'),
    Nasty("lone surrogate", "node", "POST", RECORDS, (400, 422),
          content=b'{"records":[{"value":"\\ud800"}]}'),
    # invalid base64
    Nasty("base64 value", "node", "POST", RECORDS, (400,),
          json=_produce(encoding="base64", records=[{"value": "!!not base64"}])),
    Nasty("base64 padding", "node", "POST", RECORDS, (400,),
          json=_produce(encoding="base64", records=[{"value": "eA="}])),
    Nasty("base64 key", "node", "POST", RECORDS, (400,),
          json=_produce(encoding="base64", records=[{"key": "%%%", "value": "eA=="}])),
    # oversized
    Nasty("body over the limit", "node", "POST", RECORDS, (413,),
          json=_produce(records=[{"value": "x" * 1024}] * (MAX_REQUEST_BYTES // 1000))),
    Nasty("record over the limit", "node", "POST", RECORDS, (413,),
          json=_produce(records=[{"value": "x" * (MAX_RECORD_BYTES + 1)}])),
    Nasty("8 MB topic name", "coordinator", "POST", "/v1/topics", (413, 422),
          json={"name": "n" * (8 << 20), "partitions": 1}),
    Nasty("5000-char transactional id", "coordinator", "POST",
          "/v1/transactions/" + "t" * 5000 + "/init", (404, 422), json={}),
    # negative and enormous numbers
    Nasty("negative partitions", "coordinator", "POST", "/v1/topics", (400, 422),
          json={"name": "never-made", "partitions": -1}),
    Nasty("enormous partitions", "coordinator", "POST", "/v1/topics", (400, 422),
          json={"name": "never-made", "partitions": 10**30}),
    Nasty("infinite partitions", "coordinator", "POST", "/v1/topics", (400, 422),
          content=b'{"name":"never-made","partitions":1e400}'),
    Nasty("negative timeout", "coordinator", "POST", "/v1/transactions/never-made/init",
          (400, 422), json={"transaction_timeout_ms": -1}),
    Nasty("enormous timeout", "coordinator", "POST", "/v1/transactions/never-made/init",
          (400, 422), json={"transaction_timeout_ms": 10**30}),
    Nasty("enormous producer id", "coordinator", "POST", "/v1/transactions/{tid}/commit",
          (400, 422), json={"producer_id": 2**70, "producer_epoch": 0}),
    Nasty("negative epoch", "coordinator", "POST", "/v1/transactions/{tid}/abort",
          (400, 409, 422), json={"producer_id": 0, "producer_epoch": -1}),
    Nasty("negative offset", "node", "GET", RECORDS, (400, 422), params={"offset": -1}),
    Nasty("enormous offset", "node", "GET", RECORDS, (400, 416, 422), params={"offset": 10**30}),
    Nasty("enormous max_records", "node", "GET", RECORDS, (400, 422),
          params={"offset": 0, "max_records": 10**12}),
    Nasty("negative sequence", "node", "POST", RECORDS, (400, 422),
          json=_produce(producer_id=5, producer_epoch=0, base_sequence=-5)),
    Nasty("epoch over int16", "node", "POST", RECORDS, (400, 422),
          json=_produce(producer_id=5, producer_epoch=40_000, base_sequence=0)),
    Nasty("enormous timestamp", "node", "POST", RECORDS, (400, 422),
          json=_produce(records=[{"value": "x", "timestamp_ms": 2**70}])),
    Nasty("negative group offset", "node", "POST", "/v1/groups/{group}/offsets", (400, 422),
          json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": -7}]}),
    Nasty("enormous partition in path", "node", "GET",
          f"/v1/partitions/{TOPIC}/{2**80}/offsets", (400, 404, 422)),
    # unknown enum values
    Nasty("isolation level", "node", "GET", RECORDS, (400, 422),
          params={"offset": 0, "isolation_level": "read_whatever"}),
    Nasty("encoding", "node", "POST", RECORDS, (400, 422), json=_produce(encoding="rot13")),
    Nasty("marker result", "node", "POST", "/internal/v1/markers", (400, 422), headers=INTERNAL,
          json={"markers": [{"producer_id": 1, "producer_epoch": 0, "coordinator_epoch": 0,
                             "result": "MAYBE", "partitions": [{"topic": TOPIC,
                                                                "partition": 0}]}]}),
    Nasty("key type", "coordinator", "GET", "/v1/coordinators", (400, 422),
          params={"key": "k", "key_type": "broker"}),
    Nasty("transaction state", "coordinator", "GET", "/v1/transactions", (400, 422),
          params={"state": "Pending"}),
    # huge headers: refused or ignored, never a server error, never a change
    Nasty("1 MB header", "coordinator", "POST", "/v1/topics", (200, 201, 400, 409, 431),
          json={"name": "{topic}", "partitions": 2}, headers={"X-Big": "h" * (1 << 20)}),
    Nasty("2000 headers", "node", "POST", RECORDS, (400, 413, 422, 431),
          json=_produce(encoding="rot13"), headers={f"X-H{i}": "v" for i in range(2000)}),
]  # fmt: skip


@pytest.mark.parametrize("nasty", NASTY, ids=lambda n: n.name)
def test_a_nasty_request_is_refused_in_the_envelope_and_changes_nothing(
    target: Target, nasty: Nasty
) -> None:
    names = {"topic": target.topic, "tid": target.tid, "group": target.group}
    base = target.coordinator if nasty.service == "coordinator" else target.leader(0)
    request: dict[str, Any] = {"params": nasty.params, "headers": dict(nasty.headers)}
    if nasty.content is not None:
        request["content"] = nasty.content
        request["headers"]["content-type"] = "application/json"
    elif nasty.json is not None:
        request["content"] = _fill(nasty.json, names)
        request["headers"]["content-type"] = "application/json"
    before = target.state()
    answer = httpx.request(nasty.method, base + nasty.path.format(**names), timeout=60, **request)
    assert answer.status_code in nasty.statuses, answer.text[:300]
    assert not envelope_problems(answer.status_code, answer.content)
    assert target.state() == before


def _fill(body: Any, names: dict[str, str]) -> bytes:
    """The JSON body with the run's names put in (a "{topic}" string becomes the topic)."""
    text = json.dumps(body)
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text.encode()


def test_an_id_that_is_not_utf8_is_refused(target: Target) -> None:
    aliased = "\ufffd\ufffd"  # what %FF%FE becomes once decoded with replacement
    node = httpx.get(
        f"{target.coordinator}/v1/coordinators", params={"key": aliased, "key_type": "group"}
    ).json()["url"]
    answer = httpx.post(
        f"{node}/v1/groups/%FF%FE/offsets",
        json={"offsets": [{"topic": target.topic, "partition": 0, "offset": 1}]},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    aliased_offsets = httpx.get(f"{node}/v1/groups/{aliased}/offsets", timeout=10).json()
    assert aliased_offsets["offsets"] == []  # nothing was committed under the lookalike id
    for url in (
        f"{target.coordinator}/v1/transactions/%FF/commit",  # the coordinator's fast path
        f"{target.coordinator}/v1/coordinators?key=%FE&key_type=group",  # a query
    ):
        refused = httpx.request(
            "POST" if url.endswith("commit") else "GET", url, timeout=10,
            json={"producer_id": 1, "producer_epoch": 0} if url.endswith("commit") else None,
        )
        assert refused.status_code == 400 and not envelope_problems(400, refused.content), url


def test_headers_over_the_limit_are_refused(target: Target) -> None:
    for base in (target.coordinator, target.leader(0)):
        answer = httpx.get(f"{base}/v1/metadata" if base == target.coordinator
                           else f"{base}/v1/partitions/{target.topic}/0/offsets",
                           headers={"X-Big": "h" * (100 * 1024)}, timeout=10)
        assert answer.status_code == 400, answer.text
        assert not envelope_problems(400, answer.content)
