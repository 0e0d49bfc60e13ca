"""A Python client generated from the committed documents with openapi-python-client runs
the whole transactional lifecycle against a live cluster."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.openapi.conftest import DOCS
from tests.support.cluster import Cluster

PACKAGES = {"eos_coordinator_client": "coordinator.json", "eos_node_client": "node.json"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("generated-python")
    generator = Path(sys.executable).parent / "openapi-python-client"
    for package, document in PACKAGES.items():
        subprocess.run(
            [str(generator), "generate", "--path", str(DOCS / document), "--meta", "none",
             "--output-path", str(root / package)],
            check=True, capture_output=True, text=True, timeout=120,
        )
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in list(sys.modules):
            if name.split(".")[0] in PACKAGES:
                del sys.modules[name]


def _mod(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_generated_python_client_runs_the_lifecycle(
    generated: Path, openapi_cluster: Cluster
) -> None:
    with contextlib.ExitStack() as stack:
        _lifecycle(stack, openapi_cluster)


def _lifecycle(stack: contextlib.ExitStack, openapi_cluster: Cluster) -> None:
    c = "eos_coordinator_client"
    n = "eos_node_client"
    coordinator = stack.enter_context(
        _mod(f"{c}.client").Client(base_url=openapi_cluster.url, timeout=30)
    )
    cm = _mod(f"{c}.models")
    nm = _mod(f"{n}.models")
    init = _mod(f"{c}.api.transactions.init_transactions")
    add_partitions = _mod(f"{c}.api.transactions.add_partitions_to_txn")
    commit = _mod(f"{c}.api.transactions.commit_transaction")
    abort = _mod(f"{c}.api.transactions.abort_transaction")
    create_topic = _mod(f"{c}.api.metadata.create_topic")
    produce = _mod(f"{n}.api.records.produce_records")
    fetch = _mod(f"{n}.api.records.fetch_records")

    topic_name = f"py-{uuid.uuid4().hex[:10]}"
    topic = create_topic.sync(
        client=coordinator, body=cm.CreateTopicRequest(name=topic_name, partitions=1)
    )
    assert isinstance(topic, cm.TopicInfo), topic
    leader_url = topic.partitions[0].leader.url
    storage = stack.enter_context(_mod(f"{n}.client").Client(base_url=leader_url, timeout=30))

    tid = f"py-txn-{uuid.uuid4().hex[:8]}"
    ids = init.sync(tid, client=coordinator, body=cm.InitTransactionsRequest(
        transaction_timeout_ms=60_000))
    assert isinstance(ids, cm.ProducerIdResponse), ids
    pid, epoch = ids.producer_id, ids.producer_epoch
    tp = cm.TopicPartition(topic=topic_name, partition=0)
    sequence = 0

    def transaction(values: list[str], *, end: Any) -> None:
        nonlocal sequence
        added = add_partitions.sync(tid, client=coordinator, body=cm.AddPartitionsRequest(
            producer_id=pid, producer_epoch=epoch, partitions=[tp]))
        assert isinstance(added, cm.AddPartitionsResponse), added
        assert [p.error for p in added.partitions] == [None]
        written = produce.sync(topic_name, 0, client=storage, body=nm.ProduceRequest(
            producer_id=pid, producer_epoch=epoch, base_sequence=sequence, transactional=True,
            records=[nm.RecordIn(key=f"k{i}", value=v) for i, v in enumerate(values)]))
        assert isinstance(written, nm.ProduceResponse), written
        assert written.duplicate is False
        sequence += len(values)
        ended = end.sync(tid, client=coordinator, body=cm.EndTransactionRequest(
            producer_id=pid, producer_epoch=epoch, wait_for_markers=True))
        assert isinstance(ended, cm.EndTransactionResponse), ended

    transaction(["committed-1", "committed-2"], end=commit)
    transaction(["aborted-1"], end=abort)

    page = fetch.sync(topic_name, 0, client=storage,
                      isolation_level=nm.IsolationLevel.READ_COMMITTED)
    assert isinstance(page, nm.FetchResponse), page
    assert [r.value for r in page.records] == ["committed-1", "committed-2"]

    # A second producer with the same transactional id fences the first.
    newer = init.sync(tid, client=coordinator, body=cm.InitTransactionsRequest(
        transaction_timeout_ms=60_000))
    assert isinstance(newer, cm.ProducerIdResponse)
    assert newer.producer_epoch > epoch
    fenced = add_partitions.sync_detailed(tid, client=coordinator, body=cm.AddPartitionsRequest(
        producer_id=pid, producer_epoch=epoch, partitions=[tp]))
    assert fenced.status_code == 409
    assert isinstance(fenced.parsed, cm.ErrorEnvelope)
    assert fenced.parsed.error.code == "PRODUCER_FENCED"
    assert fenced.parsed.error.retriable is False
    stale = produce.sync_detailed(topic_name, 0, client=storage, body=nm.ProduceRequest(
        producer_id=pid, producer_epoch=epoch, base_sequence=sequence, transactional=True,
        records=[nm.RecordIn(key="k", value="late")]))
    assert stale.status_code == 409
    assert isinstance(stale.parsed, nm.ErrorEnvelope)
    assert stale.parsed.error.code in {"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}
