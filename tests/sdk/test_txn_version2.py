"""The producer's transaction version 2 (KIP-890 part 2) without a server: the sequences
of ``sdk._txn_calls`` driven by hand, as in ``test_txn_calls.py`` (which covers version
1). Version 2 asks for itself at init, sends no add-partitions, and continues after every
commit or abort with the id and epoch the answer names, sequences from 0."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from eos_protocol.versions import CURRENT_FEATURES
from sdk import InvalidTxnStateError, ProducerState, TopicPartition
from sdk import _txn_calls as calls
from sdk._config import USE_DEFAULT, ProducerConfig
from sdk._producer_base import ProducerCore
from sdk._transport import Req
from sdk._txn_calls import AwaitInFlight, Call, Flush, Produce
from tests.sdk.test_txn_calls import ACK, TOPIC, Driver, call, new_core, state

pytestmark = pytest.mark.unit

S = ProducerState
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
TOPIC2 = {"name": "t", "partitions": [
    {"partition": 0, "leader": {"node_id": 1, "url": "http://n/"}},
    {"partition": 1, "leader": {"node_id": 1, "url": "http://n/"}},
]}
INIT_V2 = {"producer_id": 7, "producer_epoch": 0, "transaction_version": 2}


def ready_v2(drive: Driver, answer: dict[str, Any] = INIT_V2) -> ProducerCore:
    """A version-2 producer initialised at a cluster whose features it knows already
    (``test_versions.py`` covers learning them)."""
    core = new_core(transaction_version=2)
    core.metadata.features = CURRENT_FEATURES
    drive.run(calls.init_transactions(core, USE_DEFAULT), answer)
    return core


def send_and_ack(drive: Driver, core: ProducerCore, *partitions: int) -> list[Any]:
    """One record to each partition, sent at once (no add call first) and acknowledged;
    the batches' request bodies."""
    for p in partitions:
        lookup = [TOPIC2] if core.metadata.partition_count("t") is None else []
        drive.run(calls.send(core, "t", f"v{p}", None, p, None, None, Future()), *lookup)
    actions = core.next_actions()
    assert actions.add_partitions == []
    assert sorted(b.tp.partition for b in actions.batches) == sorted(partitions)
    bodies = []
    for batch in actions.batches:
        body = batch.request_body(True)
        drive.run(calls.produce(core, batch), ACK)
        (step,) = drive.asked
        assert isinstance(step, Produce)
        bodies.append(body)
    return bodies


def test_init_asks_for_version_2_and_takes_the_answer() -> None:
    drive = Driver()
    core = ready_v2(drive)
    (init,) = map(call, drive.asked)
    assert init.body == {"transaction_timeout_ms": 60_000, "transaction_version": 2}
    assert core.txn.nodes_add_partitions
    # a coordinator that answers without the field speaks version 1
    older = ready_v2(drive, {"producer_id": 7, "producer_epoch": 0})
    assert not older.txn.nodes_add_partitions
    older.txn.begin_transaction()
    drive.run(calls.send(older, "t", "v", None, 0, None, None, Future()), TOPIC)
    assert older.next_actions().add_partitions == [TP0]


def test_version_1_is_a_config_option_and_nothing_else_is() -> None:
    assert ProducerConfig("http://c").transaction_version is None  # negotiated at init
    with pytest.raises(ValueError, match="transaction_version"):
        ProducerConfig("http://c", transaction_version=3)
    drive = Driver()
    core = new_core(transaction_version=1)
    drive.run(calls.init_transactions(core, USE_DEFAULT), {"producer_id": 7, "producer_epoch": 0})
    assert "transaction_version" not in call(drive.asked[0]).body  # type: ignore[operator]


def test_commit_continues_at_the_bumped_epoch_with_sequences_from_zero() -> None:
    drive = Driver()
    core = ready_v2(drive)
    for epoch in range(3):
        core.txn.begin_transaction()
        assert not core.txn.needs_end_call
        bodies = send_and_ack(drive, core, 0, 1)
        assert {(b["producer_epoch"], b["base_sequence"]) for b in bodies} == {(epoch, 0)}
        assert core.txn.needs_end_call
        drive.run(calls.commit_transaction(core, USE_DEFAULT), None, {
            "transactional_id": "tid", "state": "PrepareCommit",
            "producer_id": 7, "producer_epoch": epoch + 1})
        flush, end = drive.asked
        assert flush == Flush(60.0)
        assert (call(end).req, call(end).body) == (
            Req.END_TXN, {"producer_id": 7, "producer_epoch": epoch})
        assert (state(core), core.txn.producer_epoch) == (S.READY, epoch + 1)
    assert not any(isinstance(s, Call) and s.req is Req.ADD_PARTITIONS for s in drive.asked)


def test_abort_takes_the_new_id_and_needs_no_kip360_bump() -> None:
    drive = Driver()
    core = ready_v2(drive)
    core.txn.begin_transaction()
    send_and_ack(drive, core, 0)
    core.txn.epoch_bump_required = True  # as after a sequence error
    core.txn.to_abortable(RuntimeError("a batch failed"))
    drive.run(calls.abort_transaction(core, USE_DEFAULT), None, {
        "transactional_id": "tid", "state": "PrepareAbort",
        "producer_id": 8, "producer_epoch": 0})  # the epoch ran out: a new id
    wait, end = drive.asked  # no init afterwards
    assert isinstance(wait, AwaitInFlight) and call(end).req is Req.END_TXN
    assert (state(core), core.txn.producer_id, core.txn.producer_epoch) == (S.READY, 8, 0)
    assert not core.txn.epoch_bump_required
    core.txn.begin_transaction()
    (body,) = send_and_ack(drive, core, 1)
    assert (body["producer_id"], body["producer_epoch"], body["base_sequence"]) == (8, 0, 0)


def test_the_transaction_is_open_at_the_coordinator_once_a_batch_leaves() -> None:
    drive = Driver()
    core = ready_v2(drive)
    core.txn.begin_transaction()
    drive.run(calls.commit_transaction(core, None), None)  # nothing sent: no end call
    assert drive.asked == [Flush(None)] and state(core) is S.READY
    core.txn.begin_transaction()
    drive.run(calls.send(core, "t", "v", None, 0, None, None, Future()), TOPIC2)
    assert core.txn.is_sendable(TP0) and not core.txn.needs_end_call  # queued only
    (batch,) = core.next_actions().batches
    drive.run(calls.produce(core, batch), ACK)
    assert core.txn.needs_end_call and core.txn.confirmed_at_coordinator


def test_abort_refused_when_no_batch_was_acknowledged_is_done() -> None:
    """A batch left (its node may have opened the transaction) but none was acknowledged:
    INVALID_TXN_STATE to the abort means there was nothing to abort."""
    drive = Driver()
    core = ready_v2(drive)
    core.txn.begin_transaction()
    drive.run(calls.send(core, "t", "v", None, 0, None, None, Future()), TOPIC2)
    (batch,) = core.next_actions().batches
    core.txn.on_batch_sent(batch.tp)
    assert core.txn.needs_end_call and not core.txn.confirmed_at_coordinator
    drive.run(calls.abort_transaction(core, 1.0), None, InvalidTxnStateError("none"))
    assert state(core) is S.READY
    # once a batch was acknowledged the refusal is fatal, as under version 1
    core.txn.begin_transaction()
    send_and_ack(drive, core, 1)
    with pytest.raises(InvalidTxnStateError):
        drive.run(calls.abort_transaction(core, 1.0), None, InvalidTxnStateError("none"))
    assert state(core) is S.FATAL_ERROR
