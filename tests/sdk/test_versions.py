"""Clients of this release against clusters of another (docs/design.md, "Versions and
compatibility"): the SDK learns what the cluster understands from ``features`` in its
metadata and sends only requests of that shape.

The clusters are fakes behind ``httpx.MockTransport`` that answer as the releases do: the
previous release's coordinator (commit 956be73) names no features and refuses every field
it does not know with 422 ``INVALID_REQUEST`` ("Extra inputs are not permitted"), this
release's names its features. Each test runs the blocking and the async clients (``twin``)
and checks the exact request bodies they sent.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson
import pytest

from eos_protocol.common import read_answer
from eos_protocol.coordinator import MetadataResponse
from eos_protocol.versions import (
    CURRENT_FEATURES,
    PREVIOUS_RELEASE_FEATURES,
    RELEASE,
    RELEASE_0_2_0_FEATURES,
    ClusterFeatures,
    FeatureRange,
)
from sdk import (
    FatalError,
    InvalidRequestError,
    ProducerState,
    RetryConfig,
    UnsupportedVersionError,
)
from sdk._metadata import MetadataCache, features_of
from sdk._transport import SyncTransport
from sdk._versions import choose_transaction_version, refused_field, require_protocol
from spark_jobs._wire import TransactionSession
from tests.sdk.conftest import Twin

pytestmark = pytest.mark.unit

URL = "http://coordinator"
NODE = "http://node"
FAST = RetryConfig(backoff_ms=1, backoff_max_ms=2, fast_backoff_ms=1, request_timeout_ms=1000)
TID = "orders-app"

#: The fields each request model of the previous release (956be73) takes; it refuses
#: any other one.
PREVIOUS_RELEASE_FIELDS = {
    "/v1/topics": {"name", "partitions"},
    "/v1/producers": set(),
    f"/v1/transactions/{TID}/init": {"transaction_timeout_ms", "producer_id", "producer_epoch"},
    f"/v1/transactions/{TID}/partitions": {"producer_id", "producer_epoch", "partitions"},
    f"/v1/transactions/{TID}/offsets": {"producer_id", "producer_epoch", "group_id"},
    f"/v1/transactions/{TID}/commit": {"producer_id", "producer_epoch", "wait_for_markers"},
    f"/v1/transactions/{TID}/abort": {"producer_id", "producer_epoch", "wait_for_markers"},
}
TOPIC = {"name": "t", "partitions": [{"partition": 0, "leader": {"node_id": 1, "url": NODE}}]}
FEATURES_0_3 = {"release": "0.3.0", "protocol": 4, "transaction_version": {"min": 1, "max": 2}}


class FakeCoordinator:
    """A cluster of one coordinator and one node. ``features=None`` answers as the previous
    release (metadata without ``features``, unknown request fields refused); otherwise the
    metadata names ``features``. ``owner_refuses`` makes the transaction coordinator
    refuse fields as the previous release while the metadata says otherwise (a
    coordinator not yet upgraded, the others already)."""

    def __init__(
        self, features: dict[str, Any] | None = None, *, owner_refuses: bool = False
    ) -> None:
        self.features = features
        self.owner_refuses = owner_refuses
        self.requests: list[tuple[str, str, Any]] = []
        self._epoch = 0
        self._lock = threading.Lock()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def bodies(self, path: str) -> list[Any]:
        """The bodies sent to ``path``, in order."""
        return [body for _method, p, body in self.requests if p == path]

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _body in self.requests]

    def _handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = orjson.loads(request.content) if request.content else None
        with self._lock:
            self.requests.append((request.method, path, body))
            return self._answer(request.method, path, body)

    def _refuses(self, path: str) -> bool:
        return self.features is None or (self.owner_refuses and path.startswith("/v1/trans"))

    def _answer(self, method: str, path: str, body: Any) -> httpx.Response:
        allowed = PREVIOUS_RELEASE_FIELDS.get(path)
        if method == "POST" and allowed is not None and self._refuses(path):
            extra = sorted(set(body) - allowed)
            if extra:
                return _refusal(extra)
        if path == "/v1/metadata":
            answer: dict[str, Any] = {"cluster_id": "c", "nodes": [], "topics": []}
            if self.features is not None:
                answer.update(coordinators=[{"node_id": 1, "url": URL}], features=self.features)
            return httpx.Response(200, json=answer)
        if path == "/v1/coordinators":
            return httpx.Response(200, json={"url": URL})
        if path in ("/v1/topics", "/v1/topics/t"):
            return httpx.Response(201 if method == "POST" else 200, json=TOPIC)
        if path == f"/v1/transactions/{TID}/init":
            self._epoch += 1
            answer = {"producer_id": 7, "producer_epoch": self._epoch - 1}
            if body.get("transaction_version") == 2:
                answer["transaction_version"] = 2
            return httpx.Response(200, json=answer)
        if path == f"/v1/transactions/{TID}/partitions":
            added = [{**tp, "error": None} for tp in body["partitions"]]
            return httpx.Response(200, json={"partitions": added})
        if path.endswith(("/commit", "/abort")):
            answer = {"transactional_id": TID, "state": "PrepareCommit"}
            if self.features is not None and not self.owner_refuses:
                answer.update(producer_id=7, producer_epoch=self._epoch)  # version 2's bump
                self._epoch += 1
            return httpx.Response(200, json=answer)
        if path == "/v1/partitions/t/0/records":
            return httpx.Response(200, json={"base_offset": 0, "log_append_time_ms": 1})
        return httpx.Response(200, json={})


def _refusal(fields: list[str]) -> httpx.Response:
    """The previous release's answer to unknown fields: FastAPI's schema validation in the
    error envelope (``eos_server.envelope``)."""
    problems = [{"loc": ["body", f], "msg": "Extra inputs are not permitted"} for f in fields]
    message = f"body.{fields[0]}: Extra inputs are not permitted"
    error = {"code": "INVALID_REQUEST", "message": message, "retriable": False,
             "details": {"problems": problems}}  # fmt: skip
    return httpx.Response(422, json={"error": error})


def one_transaction(producer: Any) -> None:
    producer.init_transactions()
    with producer.transaction():
        producer.send("t", "v", partition=0)


INIT = f"/v1/transactions/{TID}/init"
ADD = f"/v1/transactions/{TID}/partitions"


# --- transactional producers ----------------------------------------------------------------


def test_previous_release_gets_the_previous_requests(twin: Twin) -> None:
    """The issue's failure: the first transaction against the previous release. Without
    features the producer speaks version 1, as the previous release's producer did."""
    cluster = FakeCoordinator(features=None)
    producer = twin.transactional_producer(URL, TID, retry=FAST, transport=cluster.transport())
    one_transaction(producer)
    assert producer.state is ProducerState.READY
    assert cluster.bodies(INIT) == [{"transaction_timeout_ms": 60_000}]
    assert cluster.bodies(ADD) == [
        {"producer_id": 7, "producer_epoch": 0, "partitions": [{"topic": "t", "partition": 0}]}
    ]
    assert cluster.bodies(f"/v1/transactions/{TID}/commit") == [
        {"producer_id": 7, "producer_epoch": 0}
    ]
    assert cluster.paths()[0] == "GET /v1/metadata"  # the features, learned first


def test_current_release_gets_version_2(twin: Twin) -> None:
    cluster = FakeCoordinator(features=FEATURES_0_3)
    producer = twin.transactional_producer(URL, TID, retry=FAST, transport=cluster.transport())
    one_transaction(producer)
    one_transaction_more(producer)
    assert cluster.bodies(INIT) == [{"transaction_timeout_ms": 60_000, "transaction_version": 2}]
    assert cluster.bodies(ADD) == []  # the node adds partitions under version 2
    assert cluster.paths().count("GET /v1/metadata") == 1  # learned once, kept


def one_transaction_more(producer: Any) -> None:
    with producer.transaction():
        producer.send("t", "w", partition=0)


def test_version_1_asked_for_is_sent_without_the_field(twin: Twin) -> None:
    cluster = FakeCoordinator(features=FEATURES_0_3)
    producer = twin.transactional_producer(
        URL, TID, retry=FAST, transport=cluster.transport(), transaction_version=1
    )
    one_transaction(producer)
    assert cluster.bodies(INIT) == [{"transaction_timeout_ms": 60_000}]
    assert len(cluster.bodies(ADD)) == 1


def test_version_2_asked_of_the_previous_release_fails_at_once(twin: Twin) -> None:
    cluster = FakeCoordinator(features=None)
    producer = twin.transactional_producer(
        URL, TID, retry=FAST, transport=cluster.transport(), transaction_version=2
    )
    with pytest.raises(UnsupportedVersionError) as raised:
        producer.init_transactions()
    message = str(raised.value)
    assert "transaction version 2" in message and "transaction version 1 only" in message
    assert isinstance(raised.value, FatalError)
    assert producer.state is ProducerState.FATAL_ERROR
    assert cluster.bodies(INIT) == []  # nothing the old coordinator would refuse was sent


def test_a_coordinator_not_yet_upgraded_is_spoken_to_with_version_1(twin: Twin) -> None:
    """Coordinators are upgraded one at a time: the features came from an upgraded one,
    the transactional id's owner is still of the previous release and refuses the field.
    A producer that asked for no version retries the init with version 1."""
    cluster = FakeCoordinator(features=FEATURES_0_3, owner_refuses=True)
    producer = twin.transactional_producer(URL, TID, retry=FAST, transport=cluster.transport())
    one_transaction(producer)
    assert cluster.bodies(INIT) == [
        {"transaction_timeout_ms": 60_000, "transaction_version": 2},
        {"transaction_timeout_ms": 60_000},
    ]
    assert len(cluster.bodies(ADD)) == 1  # the version 1 flow


def test_version_2_asked_of_a_coordinator_not_yet_upgraded(twin: Twin) -> None:
    cluster = FakeCoordinator(features=FEATURES_0_3, owner_refuses=True)
    producer = twin.transactional_producer(
        URL, TID, retry=FAST, transport=cluster.transport(), transaction_version=2
    )
    with pytest.raises(UnsupportedVersionError, match="transaction version 2"):
        producer.init_transactions()
    assert producer.state is ProducerState.FATAL_ERROR
    assert len(cluster.bodies(INIT)) == 1


def test_spark_sessions_send_the_previous_requests() -> None:
    """The Spark jobs' transactions (``spark_jobs._wire``) speak version 1 by design."""
    cluster = FakeCoordinator(features=None)
    session = TransactionSession(URL, TID, retry=FAST)
    session.http.close()
    session.http = SyncTransport(FAST, transport=cluster.transport())
    try:
        session.init()
        session.commit()
    finally:
        session.close()
    assert cluster.bodies(INIT) == [{"transaction_timeout_ms": 60_000}]


# --- admin --------------------------------------------------------------------------------


def test_admin_and_the_previous_release(twin: Twin) -> None:
    cluster = FakeCoordinator(features=None)
    admin = twin.admin(URL, retry=FAST, transport=cluster.transport())
    admin.create_topic("t", 1)  # options at their defaults: the previous request
    assert cluster.bodies("/v1/topics") == [{"name": "t", "partitions": 1}]
    with pytest.raises(UnsupportedVersionError) as raised:
        admin.create_topic("t", 1, replication_factor=3, retention_ms=60_000)
    message = str(raised.value)
    assert "replication_factor, retention_ms" in message
    assert "protocol 2" in message and "protocol 1" in message
    for refused in (
        lambda: admin.alter_topic("t", retention_ms=1),
        admin.list_hanging_transactions,
        lambda: admin.abort_hanging_transaction(("t", 0), 7, 0),
        lambda: admin.delete_topic("t"),
    ):
        with pytest.raises(UnsupportedVersionError, match="protocol 1"):
            refused()
    assert len(cluster.bodies("/v1/topics")) == 1  # none of them was sent
    assert not [p for p in cluster.paths() if "hanging" in p or p.startswith(("PATCH", "DELETE"))]
    assert admin.describe_cluster().features == PREVIOUS_RELEASE_FEATURES


def test_topic_deletion_needs_protocol_4(twin: Twin) -> None:
    """A cluster of protocol 3 (0.3.0 before topic deletion) is not sent the DELETE."""
    cluster = FakeCoordinator(features={**FEATURES_0_3, "protocol": 3})
    admin = twin.admin(URL, retry=FAST, transport=cluster.transport())
    with pytest.raises(UnsupportedVersionError, match="protocol 4"):
        admin.delete_topic("t")
    assert not [p for p in cluster.paths() if p.startswith("DELETE")]


def test_admin_and_the_current_release(twin: Twin) -> None:
    cluster = FakeCoordinator(features=FEATURES_0_3)
    admin = twin.admin(URL, retry=FAST, transport=cluster.transport())
    admin.create_topic("t", 1, replication_factor=3)
    assert cluster.bodies("/v1/topics") == [{"name": "t", "partitions": 1, "replication_factor": 3}]
    assert admin.describe_cluster().features == CURRENT_FEATURES


# --- the rule, without I/O ----------------------------------------------------------------


def test_choosing_the_transaction_version() -> None:
    def features(low: int, high: int) -> ClusterFeatures:
        return ClusterFeatures(transaction_version=FeatureRange(min=low, max=high))

    assert choose_transaction_version(None, CURRENT_FEATURES) == 2
    assert choose_transaction_version(None, PREVIOUS_RELEASE_FEATURES) == 1
    assert choose_transaction_version(None, features(1, 5)) == 2  # a later release
    assert choose_transaction_version(1, CURRENT_FEATURES) == 1
    assert choose_transaction_version(2, features(2, 3)) == 2
    with pytest.raises(UnsupportedVersionError, match="speaks transaction version 3 to 4"):
        choose_transaction_version(None, features(3, 4))  # a release that dropped 1 and 2
    with pytest.raises(UnsupportedVersionError, match="asked for transaction version 1"):
        choose_transaction_version(1, features(2, 2))


def test_features_of_metadata_answers() -> None:
    assert features_of({"cluster_id": "c", "nodes": [], "topics": []}) == PREVIOUS_RELEASE_FEATURES
    assert features_of({"features": FEATURES_0_3}) == CURRENT_FEATURES
    # a later release may add features and fields: what is known is read, the rest ignored
    later = {"release": "0.9.0", "protocol": 5, "transaction_version": {"min": 1, "max": 3},
             "flexible_offsets": {"min": 0, "max": 1}}  # fmt: skip
    assert features_of({"features": later}).transaction_version == FeatureRange(min=1, max=3)
    # a feature left out is at the previous release's level
    assert features_of({"features": {"protocol": 3}}).transaction_version.max == 1
    assert features_of({"features": "garbled"}) == PREVIOUS_RELEASE_FEATURES
    # the typed answer applies the same rule
    old = read_answer(MetadataResponse, {"cluster_id": "c", "nodes": [], "topics": []})
    assert old.features == PREVIOUS_RELEASE_FEATURES
    # 0.2.0 named no features but listed its live coordinators, and took protocol 2's
    # requests and transaction version 2 (commit 28b70d3's metadata answer)
    of_0_2 = {"cluster_id": "c", "nodes": [], "coordinators": [], "topics": []}
    assert features_of(of_0_2) == RELEASE_0_2_0_FEATURES
    assert choose_transaction_version(None, features_of(of_0_2)) == 2
    assert read_answer(MetadataResponse, of_0_2).features == RELEASE_0_2_0_FEATURES
    require_protocol(features_of(of_0_2), 2, "replication_factor")  # allowed: no error


def test_features_are_refreshed_with_the_metadata() -> None:
    cache = MetadataCache("http://c")
    assert cache.features is None
    cache.update_metadata({"cluster_id": "c", "nodes": [], "topics": []})
    assert cache.features == PREVIOUS_RELEASE_FEATURES
    assert not cache.endpoints.learn_due()  # an answer without coordinators counts too
    cache.update_metadata({"cluster_id": "c", "nodes": [], "topics": [], "features": FEATURES_0_3})
    assert cache.features == CURRENT_FEATURES


def test_protocol_and_refusals() -> None:
    require_protocol(CURRENT_FEATURES, 2, "alter_topic")
    with pytest.raises(UnsupportedVersionError, match=f"this client, {RELEASE}"):
        require_protocol(PREVIOUS_RELEASE_FEATURES, 2, "alter_topic")
    problems = {"problems": [{"loc": ["body", "transaction_version"], "msg": "Extra inputs"}]}
    assert refused_field(InvalidRequestError("x", details=problems), "transaction_version")
    assert not refused_field(InvalidRequestError("x", details=problems), "replication_factor")
    assert not refused_field(InvalidRequestError("x"), "transaction_version")
    assert not refused_field(RuntimeError("x"), "transaction_version")
