"""Transaction version 2 (KIP-890 part 2) against real coordinator and storage-node
processes: the SDK's producers send no add-partitions (counted at the transport seam),
every commit or abort answers the epoch bumped by one, a late batch of an ended
transaction is refused without opening one, the epoch survives a coordinator restart,
producers of the older flow work beside them, and a node whose coordinator does not own
the producer's id reaches the owner."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson
import pytest

from sdk import ProducerState
from tests.sdk.cluster import Cluster
from tests.sdk.conftest import Twin
from tests.sdk.helpers import read_topic, uid, values, wait_for
from tests.support.cluster import ClusterFactory


class Recorder:
    """Every request a producer made (method and path), and the answers to its ends."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.ends: list[dict[str, Any]] = []
        self.inits: list[dict[str, Any]] = []
        #: The partitions produced to, by either produce path.
        self.produced: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def note(self, request: httpx.Request, response: httpx.Response) -> None:
        path = request.url.path
        with self._lock:
            self.requests.append((request.method, path))
            if request.method == "POST" and path == "/v1/produce":
                for batch in orjson.loads(request.content)["batches"]:
                    self.produced.add((batch["topic"], batch["partition"]))
            elif request.method == "POST" and path.endswith("/records"):
                _, _, topic, partition, _ = path.rsplit("/", 4)
                self.produced.add((topic, int(partition)))
            if response.status_code == 200 and path.startswith("/v1/transactions/"):
                if path.endswith(("/commit", "/abort")):
                    self.ends.append(orjson.loads(response.content))
                elif path.endswith("/init"):
                    self.inits.append(orjson.loads(response.content))

    def add_partitions_calls(self) -> int:
        return sum(
            1 for method, path in self.requests
            if method == "POST" and path.startswith("/v1/transactions/")
            and path.endswith("/partitions")
        )

    def epochs(self) -> list[int]:
        return [int(answer["producer_epoch"]) for answer in self.ends]


class _SyncRecording(httpx.HTTPTransport):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.recorder.note(request, response)
        return response


class _AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        await response.aread()
        self.recorder.note(request, response)
        return response


def recording(twin: Twin) -> tuple[Recorder, httpx.BaseTransport | httpx.AsyncBaseTransport]:
    recorder = Recorder()
    if twin.kind == "sync":
        return recorder, _SyncRecording(recorder)
    return recorder, _AsyncRecording(recorder)


def run_transactions(producer: Any, topic: str, partitions: int, rounds: int,
                     tag: str) -> list[str]:
    """``rounds`` transactions over every partition, committing the even ones and
    aborting the odd ones (after their records were written); the committed values."""
    committed: list[str] = []
    for i in range(rounds):
        producer.begin_transaction()
        by_partition = [(p, f"{tag}{i}/{p}/{n}") for p in range(partitions) for n in range(3)]
        futures = [producer.send(topic, v, partition=p) for p, v in by_partition]
        sent = [v for _p, v in by_partition]
        producer.flush()
        assert all(f.result().offset >= 0 for f in futures)
        if i % 2 == 0:
            producer.commit_transaction()
            committed += sent
        else:
            producer.abort_transaction()
        assert producer.state is ProducerState.READY
    return committed


def test_version_2_sends_no_add_partitions_and_bumps_the_epoch_per_transaction(
    twin: Twin, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=3)
    recorder, transport = recording(twin)
    producer = twin.transactional_producer(cluster.url, uid("v2"), transport=transport)
    producer.init_transactions()
    assert recorder.inits[-1]["transaction_version"] == 2
    first_epoch = int(recorder.inits[-1]["producer_epoch"])
    committed = run_transactions(producer, topic, 3, 4, "v2-")

    assert recorder.add_partitions_calls() == 0, recorder.requests
    assert recorder.epochs() == [first_epoch + n for n in range(1, 5)]
    assert recorder.produced == {(topic, p) for p in range(3)}  # each partition was written
    seen = read_topic(cluster.url, topic, 3, expect=len(committed))
    assert sorted(values(seen)) == sorted(committed)
    raw = read_topic(cluster.url, topic, 3, expect=2 * len(committed),
                     isolation_level="read_uncommitted")
    assert len(raw) == 2 * len(committed)  # the aborted ones are written, only hidden


def test_the_older_flow_works_beside_version_2(twin: Twin, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2)
    old_recorder, old_transport = recording(twin)
    new_recorder, new_transport = recording(twin)
    old = twin.transactional_producer(cluster.url, uid("v1"), transaction_version=1,
                                      transport=old_transport)
    new = twin.transactional_producer(cluster.url, uid("v2"), transport=new_transport)
    old.init_transactions()
    new.init_transactions()
    assert "transaction_version" not in old_recorder.inits[-1]
    committed: list[str] = []
    for round_ in range(2):
        committed += run_transactions(old, topic, 2, 2, f"old{round_}-")
        committed += run_transactions(new, topic, 2, 2, f"new{round_}-")

    assert old_recorder.add_partitions_calls() >= 4  # at least one per transaction
    assert all(set(answer) == {"transactional_id", "state"} for answer in old_recorder.ends)
    assert new_recorder.add_partitions_calls() == 0
    epochs = new_recorder.epochs()
    assert epochs == list(range(epochs[0], epochs[0] + 4))
    seen = read_topic(cluster.url, topic, 2, expect=len(committed))
    assert sorted(values(seen)) == sorted(committed)


def _leaders(client: httpx.Client, topic: str) -> dict[int, str]:
    info = client.get(f"/v1/topics/{topic}").json()
    return {p["partition"]: p["leader"]["url"] for p in info["partitions"]}


def _produce(url: str, topic: str, partition: int, pid: int, epoch: int, seq: int,
             value: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/partitions/{topic}/{partition}/records",
        json={"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq,
              "transactional": True, "records": [{"key": None, "value": value}]},
        timeout=30,
    )


def _offsets(url: str, topic: str, partition: int) -> dict[str, int]:
    return dict(httpx.get(f"{url}/v1/partitions/{topic}/{partition}/offsets", timeout=30).json())


def test_a_late_batch_at_the_ended_epoch_is_refused_and_opens_nothing(
    cluster: Cluster,
) -> None:
    topic = cluster.create_topic(partitions=2)
    tid = uid("late")
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        leaders = _leaders(c, topic)
        init = c.post(f"/v1/transactions/{tid}/init", json={"transaction_version": 2}).json()
        pid, epoch = init["producer_id"], init["producer_epoch"]
        # no add-partitions: the node adds partition 0 on the first batch
        assert _produce(leaders[0], topic, 0, pid, epoch, 0, "in").status_code == 200
        described = c.get(f"/v1/transactions/{tid}").json()
        assert described["state"] == "Ongoing"
        assert described["partitions"] == [{"topic": topic, "partition": 0}]
        answer = c.post(f"/v1/transactions/{tid}/commit", json={
            "producer_id": pid, "producer_epoch": epoch, "wait_for_markers": True}).json()
        assert answer["state"] == "CompleteCommit" and answer["producer_epoch"] == epoch + 1

        # late batches of the ended transaction: the next in sequence on its partition,
        # and a first one to a partition it never touched
        for partition, seq in ((0, 1), (1, 0)):
            late = _produce(leaders[partition], topic, partition, pid, epoch, seq, "late")
            assert late.status_code == 409, late.text
            assert late.json()["error"]["code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
        described = c.get(f"/v1/transactions/{tid}").json()
        assert described["state"] == "CompleteCommit"
        assert described["producer_epoch"] == epoch + 1
        for partition in (0, 1):  # nothing holds the LSO back
            offsets = _offsets(leaders[partition], topic, partition)
            assert offsets["last_stable_offset"] == offsets["high_watermark"], offsets

        # the producer goes on at the bumped epoch, its sequence from 0
        assert _produce(leaders[1], topic, 1, pid, epoch + 1, 0, "next").status_code == 200
        answer = c.post(f"/v1/transactions/{tid}/abort", json={
            "producer_id": pid, "producer_epoch": epoch + 1, "wait_for_markers": True}).json()
        assert answer["producer_epoch"] == epoch + 2
    seen = read_topic(cluster.url, topic, 2, expect=1)
    assert values(seen) == ["in"]


@pytest.mark.slow
def test_the_bumped_epoch_survives_a_coordinator_restart(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(database="postgres")
    topic = cluster.create_topic(partitions=2)
    tid = uid("restart")
    recorder = Recorder()
    from sdk import TransactionalProducer

    with TransactionalProducer(cluster.url, tid, transport=_SyncRecording(recorder)) as producer:
        producer.init_transactions()
        first_epoch = int(recorder.inits[-1]["producer_epoch"])
        committed = run_transactions(producer, topic, 2, 3, "before-")
        cluster.coordinator.kill()
        cluster.start_coordinator(0)
        committed += run_transactions(producer, topic, 2, 3, "after-")
        assert recorder.epochs() == [first_epoch + n for n in range(1, 7)]
        assert recorder.add_partitions_calls() == 0
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        described = c.get(f"/v1/transactions/{tid}").json()
        assert described["producer_epoch"] == first_epoch + 6
    seen = read_topic(cluster.url, topic, 2, expect=len(committed))
    assert sorted(values(seen)) == sorted(committed)


def _owned_by(cluster: Cluster, index: int) -> str:
    """A transactional id whose log partition coordinator ``index`` owns."""
    owner = cluster.coordinator_url(index).rstrip("/")

    def find() -> str | None:
        with httpx.Client(base_url=cluster.coordinator_url(1 - index), timeout=30) as c:
            for n in range(200):
                tid = f"owned-{n}"
                found = c.get("/v1/coordinators", params={"key": tid})
                if found.status_code == 200 and found.json()["url"].rstrip("/") == owner:
                    return tid
        return None

    tid: str = wait_for(find, timeout=60, what=f"an id owned by coordinator {index}")
    return tid


@pytest.mark.slow
def test_nodes_reach_the_owner_through_another_coordinator(
    cluster_factory: ClusterFactory,
) -> None:
    """The nodes and the client know only coordinator 1; the id is coordinator 0's."""
    cluster = cluster_factory(database="postgres", coordinators=2, entry=1)
    topic = cluster.create_topic(partitions=2)
    tid = _owned_by(cluster, 0)
    recorder = Recorder()
    from sdk import TransactionalProducer

    with TransactionalProducer(cluster.coordinator_url(1), tid,
                               transport=_SyncRecording(recorder)) as producer:
        producer.init_transactions()
        committed = run_transactions(producer, topic, 2, 4, "owner-")
    assert recorder.add_partitions_calls() == 0
    epochs = recorder.epochs()
    assert epochs == list(range(epochs[0], epochs[0] + 4))
    seen = read_topic(cluster.coordinator_url(1), topic, 2, expect=len(committed))
    assert sorted(values(seen)) == sorted(committed)
