"""The producer's request sequences (``sdk._txn_calls``) and the twins' drivers of them.

Most tests drive a sequence by hand, as the twins' drivers do: they record the steps the
sequence asks for, answer each (or throw the step's error in), and check the state the
core is left in and the error the call raises. The last ones run both producers (blocking
and async, through the ``twin`` fixture) against a fake cluster in memory behind
``httpx.MockTransport``, so each driver is shown to do each step's I/O and hand back its
answer or error, the transport's in-place retries included, which no core test can see.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any, TypeVar

import httpx
import orjson
import pytest

from sdk import (
    ConcurrentTransactionsError,
    EosTimeoutError,
    IllegalStateError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceNumberError,
    ProducerClosedError,
    ProducerFencedError,
    ProducerState,
    RetryConfig,
    TopicPartition,
    TransactionAbortableError,
    TransactionalIdAuthorizationFailedError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from sdk import _txn_calls as calls
from sdk._config import USE_DEFAULT, ProducerConfig
from sdk._producer_base import ProducerCore
from sdk._transport import Req
from sdk._txn_calls import AwaitInFlight, Call, Flush, Produce, Step, Steps
from tests.sdk.conftest import Twin

pytestmark = pytest.mark.unit

T = TypeVar("T")
S = ProducerState
TP = TopicPartition("t", 0)
TOPIC = {"name": "t", "partitions": [{"partition": 0, "leader": {"node_id": 1, "url": "http://n/"}}]}
ADDED = {"partitions": [{"topic": "t", "partition": 0, "error": None}]}
ACK = {"base_offset": 0, "log_append_time_ms": 1}


class Driver:
    """Runs a sequence with scripted answers; an exception among them is thrown in."""

    def __init__(self) -> None:
        self.asked: list[Step] = []

    def run(self, steps: Steps[T], *answers: object) -> T:
        self.asked = []
        script = list(answers)
        answer: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(answer) if error is None else steps.throw(error)
            except StopIteration as done:
                assert not script, f"answers left over: {script}"
                result: T = done.value
                return result
            self.asked.append(step)
            assert script, f"no answer scripted for {step}"
            outcome = script.pop(0)
            if isinstance(outcome, BaseException):
                answer, error = None, outcome
            else:
                answer, error = outcome, None


def state(core: ProducerCore) -> ProducerState:
    """The state, read through a call so that mypy does not narrow it for good."""
    return core.state


def new_core(transactional_id: str | None = "tid", transaction_version: int = 1) -> ProducerCore:
    """A core of the older flow (add-partitions) unless asked for version 2, which
    ``test_txn_version2.py`` covers."""
    config = ProducerConfig(
        "http://c", transactional_id=transactional_id, linger_ms=0,
        transaction_version=transaction_version,
    )
    core = ProducerCore(config, batch_future=Future)
    core.metadata.txn_coordinator = "http://coord"
    return core


def ready(drive: Driver) -> ProducerCore:
    core = new_core()
    drive.run(calls.init_transactions(core, USE_DEFAULT), {"producer_id": 7, "producer_epoch": 0})
    return core


def with_a_record(drive: Driver) -> tuple[ProducerCore, Future[Any]]:
    """In a transaction, one record queued for a partition the coordinator has added."""
    core = ready(drive)
    core.txn.begin_transaction()
    record: Future[Any] = Future()
    assert drive.run(calls.send(core, "t", "v", None, 0, None, None, record), TOPIC)
    drive.run(calls.add_partitions(core, core.next_actions().add_partitions), ADDED)
    assert core.txn.partitions == {TP}
    return core, record


def sent_batch(drive: Driver, core: ProducerCore, answer: object) -> None:
    (batch,) = core.next_actions().batches
    drive.run(calls.produce(core, batch), answer)
    assert drive.asked == [Produce((batch,), "http://n/v1/partitions/t/0/records",
                                   batch.request_body(True))]


def call(step: Step) -> Call:
    assert isinstance(step, Call)
    return step


# --- init_transactions ---------------------------------------------------------------------


def test_init_transactions_asks_the_coordinator_for_an_id() -> None:
    drive, core = Driver(), new_core()
    drive.run(calls.init_transactions(core, 2.5), {"producer_id": 7, "producer_epoch": 3})
    (init,) = map(call, drive.asked)
    assert (init.req, init.method, init.path) == (
        Req.INIT_TRANSACTIONS, "POST", "/v1/transactions/tid/init")
    assert init.body == {"transaction_timeout_ms": 60_000} and init.timeout_s == 2.5
    assert (state(core), core.txn.producer_id, core.txn.producer_epoch) == (S.READY, 7, 3)


def test_the_coordinator_is_found_once_then_kept() -> None:
    drive, core = Driver(), new_core()
    core.metadata.txn_coordinator = None
    assert drive.run(calls.coordinator_url(core), {"url": "http://coord/"}) == "http://coord"
    (find,) = map(call, drive.asked)
    assert (find.req, find.method, find.path, find.params, find.locate) == (
        Req.FIND_COORDINATOR, "GET", "/v1/coordinators",
        {"key": "tid", "key_type": "transaction"}, None)
    assert drive.run(calls.coordinator_url(core)) == "http://coord"
    assert drive.asked == []


@pytest.mark.parametrize("fatal", [ProducerFencedError, TransactionalIdAuthorizationFailedError])
def test_init_transactions_fatal_error_ends_the_producer(fatal: type[Exception]) -> None:
    drive, core = Driver(), new_core()
    error = fatal("no")
    with pytest.raises(fatal) as raised:
        drive.run(calls.init_transactions(core, USE_DEFAULT), error)
    assert raised.value is error and state(core) is S.FATAL_ERROR
    with pytest.raises(fatal):  # every later call raises it again, without a request
        drive.run(calls.init_transactions(core, USE_DEFAULT))


def test_init_transactions_timeout_may_be_called_again() -> None:
    drive, core = Driver(), new_core()
    with pytest.raises(EosTimeoutError):
        drive.run(calls.init_transactions(core, USE_DEFAULT), EosTimeoutError("late"))
    assert state(core) is S.INITIALIZING
    drive.run(calls.init_transactions(core, USE_DEFAULT), {"producer_id": 7, "producer_epoch": 1})
    assert (state(core), core.txn.producer_epoch) == (S.READY, 1)


# --- send and the sender's requests --------------------------------------------------------


def test_send_looks_the_topic_up_and_adds_the_partition_first() -> None:
    drive = Driver()
    core, record = with_a_record(drive)
    add = call(drive.asked[0])
    assert (add.req, add.path, add.timeout_s) == (
        Req.ADD_PARTITIONS, "/v1/transactions/tid/partitions", 60.0)
    assert callable(add.body)  # built anew for each attempt
    sent_batch(drive, core, ACK)
    assert record.result(0).offset == 0 and core.txn.opened == {TP}


def test_send_outside_a_transaction_or_after_close_asks_for_nothing() -> None:
    drive = Driver()
    core = ready(drive)
    with pytest.raises(IllegalStateError, match="call begin_transaction first"):
        drive.run(calls.send(core, "t", "v", None, None, None, None, Future()))
    core.closed = True
    with pytest.raises(ProducerClosedError):
        drive.run(calls.send(core, "t", "v", None, None, None, None, Future()))
    assert drive.asked == []


def test_a_partition_the_coordinator_refuses_makes_the_transaction_abortable() -> None:
    drive = Driver()
    core = ready(drive)
    core.txn.begin_transaction()
    drive.run(calls.send(core, "t", "v", None, 0, None, None, Future()), TOPIC)
    refused = {"partitions": [{"topic": "t", "partition": 0, "error": "TRANSACTION_ABORTABLE"}]}
    drive.run(calls.add_partitions(core, core.next_actions().add_partitions), refused)
    assert state(core) is S.ABORTABLE_ERROR and isinstance(core.txn.last_error,
                                                          TransactionAbortableError)


def test_idempotent_producer_id_failure_is_kept_not_raised() -> None:
    drive, core = Driver(), new_core(None)
    core.init_in_flight = True
    drive.run(calls.init_producer_id(core), EosTimeoutError("late"))
    assert state(core) is S.UNINITIALIZED and not core.init_in_flight
    drive.run(calls.init_producer_id(core), ProducerFencedError("no"))
    assert state(core) is S.FATAL_ERROR
    (init,) = map(call, drive.asked)
    assert (init.req, init.path, init.body, init.locate) == (
        Req.INIT_PRODUCER_ID, "/v1/producers", {}, None)


# --- commit --------------------------------------------------------------------------------


def test_commit_that_timed_out_is_committed_by_calling_again() -> None:
    """The end call's retries ran out (the transport retried CONCURRENT_TRANSACTIONS and
    lost answers in place): the producer stays COMMITTING and the next call commits."""
    drive = Driver()
    core, _ = with_a_record(drive)
    sent_batch(drive, core, ACK)
    with pytest.raises(EosTimeoutError):
        drive.run(calls.commit_transaction(core, USE_DEFAULT), None, EosTimeoutError("late"))
    assert state(core) is S.COMMITTING_TRANSACTION
    drive.run(calls.commit_transaction(core, 4.0), None, {})
    flush, end = drive.asked
    assert flush == Flush(4.0)
    assert (call(end).req, call(end).path, call(end).body, call(end).timeout_s) == (
        Req.END_TXN, "/v1/transactions/tid/commit", {"producer_id": 7, "producer_epoch": 0}, 4.0)
    assert state(core) is S.READY and not core.txn.partitions


def test_commit_retriable_error_after_its_retries_makes_the_transaction_abortable() -> None:
    drive = Driver()
    core, _ = with_a_record(drive)
    sent_batch(drive, core, ACK)
    error = ConcurrentTransactionsError("busy")
    with pytest.raises(ConcurrentTransactionsError) as raised:
        drive.run(calls.commit_transaction(core, USE_DEFAULT), None, error)
    assert raised.value is error and state(core) is S.ABORTABLE_ERROR


def test_commit_of_a_transaction_that_added_nothing_sends_no_end_call() -> None:
    drive = Driver()
    core = ready(drive)
    core.txn.begin_transaction()
    drive.run(calls.commit_transaction(core, None), None)
    assert drive.asked == [Flush(None)] and state(core) is S.READY


# --- KIP-360: abortable errors bump the epoch, fatal ones end the producer ----------------


@pytest.mark.parametrize("sequence_error", [UnknownProducerIdError, OutOfOrderSequenceNumberError])
def test_sequence_error_is_abortable_and_the_abort_bumps_the_epoch(
    sequence_error: type[Exception],
) -> None:
    drive = Driver()
    core, record = with_a_record(drive)
    sent_batch(drive, core, sequence_error("gap"))
    assert isinstance(record.exception(0), sequence_error)
    assert state(core) is S.ABORTABLE_ERROR and core.txn.epoch_bump_required

    with pytest.raises(sequence_error):  # refused before any request
        drive.run(calls.commit_transaction(core, USE_DEFAULT))
    assert drive.asked == []

    drive.run(calls.abort_transaction(core, USE_DEFAULT), None, {},
              {"producer_id": 7, "producer_epoch": 1})
    wait, end, bump = drive.asked
    assert wait == AwaitInFlight([], 60.0)
    assert (call(end).req, call(end).path) == (Req.END_TXN, "/v1/transactions/tid/abort")
    assert (call(bump).req, call(bump).body) == (Req.INIT_TRANSACTIONS, {
        "transaction_timeout_ms": 60_000, "producer_id": 7, "producer_epoch": 0})
    assert (state(core), core.txn.producer_id, core.txn.producer_epoch) == (S.READY, 7, 1)
    assert not core.txn.epoch_bump_required


def test_abortable_end_call_error_is_aborted_without_an_epoch_bump() -> None:
    drive = Driver()
    core, _ = with_a_record(drive)
    sent_batch(drive, core, ACK)
    with pytest.raises(TransactionAbortableError):
        drive.run(calls.commit_transaction(core, USE_DEFAULT), None,
                  TransactionAbortableError("abort it"))
    assert state(core) is S.ABORTABLE_ERROR and not core.txn.epoch_bump_required
    drive.run(calls.abort_transaction(core, USE_DEFAULT), None, {})
    assert len(drive.asked) == 2 and state(core) is S.READY
    assert core.txn.producer_epoch == 0


@pytest.mark.parametrize(
    "fatal", [ProducerFencedError, InvalidProducerEpochError, TransactionCoordinatorFencedError]
)
def test_fatal_end_call_error_ends_the_producer(fatal: type[Exception]) -> None:
    drive = Driver()
    core, _ = with_a_record(drive)
    sent_batch(drive, core, ACK)
    error = fatal("fenced")
    with pytest.raises(fatal) as raised:
        drive.run(calls.commit_transaction(core, USE_DEFAULT), None, error)
    assert raised.value is error and state(core) is S.FATAL_ERROR
    with pytest.raises(fatal):  # no way out but close
        drive.run(calls.abort_transaction(core, USE_DEFAULT))
    assert drive.asked == []


def test_fatal_sequence_error_of_a_batch_ends_the_producer() -> None:
    drive = Driver()
    core, record = with_a_record(drive)
    sent_batch(drive, core, ProducerFencedError("a newer producer"))
    assert isinstance(record.exception(0), ProducerFencedError)
    assert state(core) is S.FATAL_ERROR


def test_abort_refused_after_partitions_were_added_is_fatal() -> None:
    drive = Driver()
    core, _ = with_a_record(drive)
    error = InvalidTxnStateError("no such transaction")
    with pytest.raises(InvalidTxnStateError) as raised:
        drive.run(calls.abort_transaction(core, USE_DEFAULT), None, error)
    assert raised.value is error and state(core) is S.FATAL_ERROR
    assert isinstance(core.txn.last_error, InvalidTxnStateError)
    assert str(core.txn.last_error).endswith("abort refused")


def test_abort_refused_when_nothing_was_confirmed_added_is_done() -> None:
    drive = Driver()
    core = ready(drive)
    core.txn.begin_transaction()
    core.txn.maybe_add_partition(TP)
    core.txn.partitions_to_add()  # the add is in flight, never confirmed
    drive.run(calls.abort_transaction(core, 1.0), None, InvalidTxnStateError("none"))
    assert drive.asked[0] == AwaitInFlight([], 1.0) and state(core) is S.READY


def test_abort_timeout_leaves_it_to_call_again() -> None:
    drive = Driver()
    core, _ = with_a_record(drive)
    with pytest.raises(EosTimeoutError):
        drive.run(calls.abort_transaction(core, USE_DEFAULT), EosTimeoutError("in flight"))
    assert state(core) is S.ABORTING_TRANSACTION
    drive.run(calls.abort_transaction(core, USE_DEFAULT), None, {})
    assert state(core) is S.READY


# --- send_offsets_to_transaction -----------------------------------------------------------


def test_offsets_go_to_the_coordinator_then_to_the_group_node() -> None:
    drive = Driver()
    core = ready(drive)
    core.txn.begin_transaction()
    drive.run(calls.send_offsets_to_transaction(core, {("t", 0): 42}, "g", 3.0), {}, {})
    add, commit = map(call, drive.asked)
    assert (add.req, add.path, add.body) == (
        Req.ADD_OFFSETS, "/v1/transactions/tid/offsets",
        {"producer_id": 7, "producer_epoch": 0, "group_id": "g"})
    assert (commit.req, commit.path, commit.timeout_s) == (
        Req.TXN_OFFSET_COMMIT, "/v1/groups/g/txn-offsets", 3.0)
    assert commit.body == {"transactional_id": "tid", "producer_id": 7, "producer_epoch": 0,
                           "offsets": [{"topic": "t", "partition": 0, "offset": 42,
                                        "metadata": None}]}
    assert commit.locate is not None
    assert drive.run(commit.locate(), {"url": "http://node/"}) == "http://node"
    assert call(drive.asked[0]).params == {"key": "g", "key_type": "group"}
    assert core.txn.groups == {"g"} and core.txn.needs_end_call


def test_offsets_commit_failure_makes_the_transaction_abortable() -> None:
    drive = Driver()
    core = ready(drive)
    core.txn.begin_transaction()
    with pytest.raises(EosTimeoutError):
        drive.run(calls.send_offsets_to_transaction(core, {("t", 0): 1}, "g", USE_DEFAULT),
                  {}, EosTimeoutError("late"))
    assert state(core) is S.ABORTABLE_ERROR and core.txn.groups == {"g"}


def test_offsets_outside_a_transaction_ask_for_nothing() -> None:
    drive = Driver()
    core = ready(drive)
    with pytest.raises(IllegalStateError):
        drive.run(calls.send_offsets_to_transaction(core, {("t", 0): 1}, "g", USE_DEFAULT))
    assert drive.asked == []


# --- the drivers, over httpx.MockTransport -------------------------------------------------

URL = "http://coordinator"
NODE = "http://node"
FAST = RetryConfig(backoff_ms=1, backoff_max_ms=2, fast_backoff_ms=1, request_timeout_ms=1000)


class FakeCluster:
    """Answers a producer's requests from memory; ``fail`` makes the next requests to a
    path answer error codes first. Thread-safe: the blocking producer calls from workers."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._faults: dict[str, list[str]] = {}
        self._epoch = 0
        self._offset = 0
        self._lock = threading.Lock()

    def fail(self, path: str, *codes: str) -> None:
        self._faults[path] = list(codes)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        with self._lock:
            self.calls[path] += 1
            codes = self._faults.get(path)
            if codes:
                error = {"code": codes.pop(0), "message": "injected"}
                return httpx.Response(400, json={"error": error})
            return httpx.Response(200, json=self._answer(path, request))

    def _answer(self, path: str, request: httpx.Request) -> object:
        if path == "/v1/coordinators":
            return {"url": URL}
        if path == "/v1/topics/t":
            return {"name": "t", "partitions": [{"partition": 0, "leader": {"url": NODE}}]}
        if path in ("/v1/producers", "/v1/transactions/tid/init"):
            self._epoch += 1
            return {"producer_id": 7, "producer_epoch": self._epoch - 1}
        if path == "/v1/transactions/tid/partitions":
            asked = orjson.loads(request.content)["partitions"]
            return {"partitions": [{**tp, "error": None} for tp in asked]}
        if path == "/v1/partitions/t/0/records":
            self._offset += len(orjson.loads(request.content)["records"])
            return {"base_offset": self._offset - 1, "log_append_time_ms": 1}
        return {}  # metadata, offsets, txn-offsets, commit, abort


def test_commit_retried_in_place_after_concurrent_transactions(twin: Twin) -> None:
    cluster = FakeCluster()
    cluster.fail("/v1/transactions/tid/commit", "CONCURRENT_TRANSACTIONS")
    producer = twin.transactional_producer(URL, "tid", retry=FAST, transport=cluster.transport())
    producer.init_transactions()
    with producer.transaction():
        sent = producer.send("t", "v", key="k")
        producer.send_offsets_to_transaction({("t", 0): 1}, "g")
    assert sent.result().offset == 0
    assert producer.state is ProducerState.READY
    assert cluster.calls["/v1/transactions/tid/commit"] == 2
    assert cluster.calls["/v1/groups/g/txn-offsets"] == 1


def test_sequence_error_is_aborted_then_the_epoch_bumped(twin: Twin) -> None:
    cluster = FakeCluster()
    producer = twin.transactional_producer(URL, "tid", retry=FAST, transport=cluster.transport())
    producer.init_transactions()
    cluster.fail("/v1/partitions/t/0/records", "UNKNOWN_PRODUCER_ID")
    producer.begin_transaction()
    assert isinstance(producer.send("t", "doomed").exception(), UnknownProducerIdError)
    assert producer.state is ProducerState.ABORTABLE_ERROR
    producer.abort_transaction()
    assert producer.state is ProducerState.READY  # type: ignore[comparison-overlap]
    assert (producer.producer_id, producer.producer_epoch) == (7, 1)
    assert cluster.calls["/v1/transactions/tid/abort"] == 1


def test_fenced_commit_ends_the_producer(twin: Twin) -> None:
    cluster = FakeCluster()
    cluster.fail("/v1/transactions/tid/commit", "PRODUCER_FENCED")
    producer = twin.transactional_producer(URL, "tid", retry=FAST, transport=cluster.transport())
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", "v").result()
    with pytest.raises(ProducerFencedError):
        producer.commit_transaction()
    assert producer.state is ProducerState.FATAL_ERROR
    assert cluster.calls["/v1/transactions/tid/commit"] == 1


def test_idempotent_producer_takes_an_id_then_sends(twin: Twin) -> None:
    cluster = FakeCluster()
    producer = twin.producer(URL, retry=FAST, transport=cluster.transport())
    assert producer.send("t", "a").result().offset == 0
    assert producer.send("t", "b").result().offset == 1
    assert cluster.calls["/v1/producers"] == 1
