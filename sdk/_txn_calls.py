"""The producer's request sequences, written once for both twins and free of I/O.

Every producer call that talks to the cluster follows the same sequence: check the state,
build the request, make it, then read the answer or classify the error (fatal, abortable,
a timeout that leaves the call to be repeated, a KIP-360 sequence error that asks for an
epoch bump), move the state, and return or re-raise. Each sequence here is a generator
over a ``ProducerCore``: it yields a *step* (``Call``, ``Produce``, ``Flush``,
``AwaitInFlight``), and the twin's driver performs the step (blocking or awaited) and
sends the answer back in, or throws the step's error in at the ``yield``::

    core.txn.begin_commit()              # the generator's code, no I/O
    yield Flush(timeout_s)               # the driver flushes, sync or async
    try:
        yield txn_call(core, Req.END_TXN, "commit", core.end_body(), timeout)
    except Exception as exc:             # the call's error, thrown in by the driver
        core.on_request_error(exc)
        raise

Why generators and not a pair of "plan"/"complete" methods per call: the sequences have
several steps whose errors are each treated differently (commit: flush, then the end
call, then completion; abort: wait for the sends, the end call, then the KIP-360 epoch
bump), and a sub-step may need I/O of its own (the coordinator is looked up within a
call's retries). Plan/complete methods would have to remember by hand which step a call
is at; a generator keeps each sequence the straight-line code it was in the twins, with
``try``/``except`` around each ``yield``, so the error rules read as before and are
tested by driving the generator with ``send``/``throw``, no server needed.

The driver runs each stretch between two steps under the producer's lock (the sync twin's
condition) and the step's I/O outside it, so a sequence never blocks the sender.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from eos_protocol.coordinator import TRANSACTION_VERSION_1
from eos_protocol.errors import (
    InternalError,
    InvalidRequestError,
    InvalidTxnStateError,
    NotFoundError,
)
from eos_protocol.versions import PREVIOUS_RELEASE_FEATURES, ClusterFeatures
from sdk._accumulator import FutureLike, ProducerBatch
from sdk._config import USE_DEFAULT, TimeoutArg, resolve_timeout
from sdk._errors import EosTimeoutError
from sdk._metadata import (
    PRODUCE_MANY_PATH,
    find_coordinator_params,
    group_path,
    records_path,
    topic_path,
    txn_path,
)
from sdk._producer_base import LEADER_CHECK_S, Body, ProducerCore, normalise_offsets
from sdk._state import ProducerState
from sdk._transport import MEMBERS_PARAMS, MEMBERS_PATH, Invalidate, Req, error_from_body
from sdk._types import ConsumerGroupMetadata, Offsets, Payload, TopicPartition
from sdk._versions import (
    choose_transaction_version,
    refused_field,
    unsupported_transaction_version,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """A request made with the retry rule of ``req`` (the transport's ``call``).

    ``locate`` is the sequence that finds the target's base URL, asked again on every
    attempt so that a coordinator found anew is used at once; None: any coordinator
    (the bootstrap). ``body`` may be a function, asked for the body of each attempt.
    """

    req: Req
    method: str
    path: str
    timeout_s: float | None
    body: Body | None = None
    params: dict[str, str] | None = None
    locate: Callable[[], Steps[str]] | None = None
    invalidate: Invalidate | None = None


@dataclass(frozen=True)
class Produce:
    """One attempt of a produce request: one batch to its partition's path, or the batches
    of several partitions led by one node in one ``POST /v1/produce``. The sender
    reschedules a failed batch itself (``ProducerCore.on_produce_error``), so that a
    partition keeps its order."""

    batches: tuple[ProducerBatch, ...]
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Flush:
    """The producer's ``flush``: send what is queued, wait for every acknowledgement."""

    timeout_s: float | None


@dataclass(frozen=True)
class AwaitInFlight:
    """Wait for the add-partitions call in flight (a timeout there is no error), then for
    ``pending`` (``EosTimeoutError`` once ``timeout_s`` has passed)."""

    pending: list[FutureLike[None]]
    timeout_s: float | None


Step: TypeAlias = Call | Produce | Flush | AwaitInFlight
#: A sequence: yields steps, is sent each step's answer, returns the call's result.
Steps: TypeAlias = Generator[Step, Any, T]


# --- where requests go -------------------------------------------------------------------


def _find_coordinator(core: ProducerCore, key: str, key_type: str) -> Call:
    """Ask any coordinator who owns ``key`` (a transactional id, or a group's offsets)."""
    return Call(
        Req.FIND_COORDINATOR,
        "GET",
        "/v1/coordinators",
        timeout_s=core.config.max_block_ms / 1000,
        params=find_coordinator_params(key, key_type),
    )


def coordinator_url(core: ProducerCore) -> Steps[str]:
    """The transaction coordinator of this producer's transactional id."""
    url = core.metadata.txn_coordinator
    if url is None:
        tid = core.txn.transactional_id
        assert tid is not None
        body = yield _find_coordinator(core, tid, "transaction")
        url = core.metadata.txn_coordinator = str(body["url"]).rstrip("/")
    return url


def group_node_url(core: ProducerCore, group_id: str) -> Steps[str]:
    """The storage node that keeps ``group_id``'s offsets."""
    url = core.metadata.group_node(group_id)
    if url is None:
        body = yield _find_coordinator(core, group_id, "group")
        core.metadata.set_group_node(group_id, str(body["url"]))
        url = core.metadata.group_node(group_id)
        assert url is not None
    return url


def _first_coordinator(core: ProducerCore) -> Steps[str]:
    """Any coordinator, without the bootstrap's own learning call (the caller's request
    is that call)."""
    yield from ()
    return core.metadata.bootstrap_url


def cluster_features(core: ProducerCore) -> Steps[ClusterFeatures]:
    """What the cluster understands: learned with the live coordinators (and refreshed
    with them), asked for here only when no metadata answer came yet."""
    features = core.metadata.features
    if features is None:
        body = yield Call(
            Req.METADATA,
            "GET",
            MEMBERS_PATH,
            timeout_s=core.config.max_block_ms / 1000,
            params=dict(MEMBERS_PARAMS),
            locate=lambda: _first_coordinator(core),
        )
        core.metadata.update_metadata(body)
        features = core.metadata.features
        assert features is not None
    return features


def fetch_topic(core: ProducerCore, topic: str) -> Steps[list[str]]:
    """Look the topic up; returns its leaders' URLs by partition."""
    timeout_s = core.config.max_block_ms / 1000
    body = yield Call(Req.TOPIC, "GET", topic_path(topic), timeout_s=timeout_s)
    return core.metadata.update_topic(body)


def refresh_leaders(core: ProducerCore, batches: Iterable[ProducerBatch]) -> Steps[None]:
    """Look the leaders of ``batches``' topics up again, for a produce attempt that has
    gone unanswered (``LEADER_CHECK_S``); briefly, as the attempt is still out. A topic
    looked up within the last half of that is not asked again: every attempt at a silent
    node watches, and a hundred of them must not make a hundred lookups a second."""
    for topic in sorted({batch.tp.topic for batch in batches}):
        if not core.leaders_check_due(topic):
            continue
        body = yield Call(Req.TOPIC, "GET", topic_path(topic), timeout_s=2 * LEADER_CHECK_S)
        core.metadata.update_topic(body)


def txn_call(core: ProducerCore, req: Req, action: str, body: Body, timeout: TimeoutArg) -> Call:
    """A request to the transaction coordinator (``/v1/transactions/{id}/{action}``)."""
    tid = core.txn.transactional_id
    assert tid is not None
    return Call(
        req,
        "POST",
        txn_path(tid, action),
        timeout_s=resolve_timeout(timeout, core.config.max_block_ms),
        body=body,
        locate=lambda: coordinator_url(core),
        invalidate=core.metadata.invalidate_txn_coordinator,
    )


# --- the sender's requests ---------------------------------------------------------------


def send(
    core: ProducerCore,
    topic: str,
    value: Payload | None,
    key: Payload | None,
    partition: int | None,
    headers: dict[str, str] | None,
    timestamp_ms: int | None,
    future: FutureLike[Any],
) -> Steps[bool]:
    """Queue a record (the topic looked up first if unknown); True if the sender should
    look at the queues now. The state is checked again after the lookup: another thread
    or task may have ended the transaction meanwhile."""
    core.check_send()
    if core.metadata.partition_count(topic) is None:
        yield from fetch_topic(core, topic)
    core.check_send()
    tp = core.choose_partition(topic, key, partition)
    keyless = key is None and partition is None
    return core.append(tp, key, value, headers, timestamp_ms, future, keyless)


def init_producer_id(core: ProducerCore) -> Steps[None]:
    """An idempotent producer's id; a failure is the core's to react to, not raised."""
    try:
        body = yield Call(
            Req.INIT_PRODUCER_ID,
            "POST",
            "/v1/producers",
            timeout_s=core.config.max_block_ms / 1000,
            body={},
        )
    except Exception as exc:
        core.on_producer_id_failed(exc)
        return
    core.on_producer_id(body)


def add_partitions(core: ProducerCore, tps: list[TopicPartition]) -> Steps[None]:
    """Add the transaction's new partitions at the coordinator (one call for all)."""
    try:
        answer = yield txn_call(
            core, Req.ADD_PARTITIONS, "partitions", lambda: core.add_partitions_body(tps),
            USE_DEFAULT,
        )
    except Exception as exc:
        core.on_add_failed(tps, exc)
        return
    core.on_add_result(tps, answer)


def produce(core: ProducerCore, batch: ProducerBatch) -> Steps[None]:
    """Send one batch to its partition's leader (looked up first if unknown or stale)."""
    try:
        url = core.metadata.leader(batch.tp)
        if url is None:
            yield from fetch_topic(core, batch.tp.topic)
            url = core.metadata.leader(batch.tp)  # LEADER_NOT_AVAILABLE when it has none
            assert url is not None
        core.txn.on_batch_sent(batch.tp)
        body = yield Produce(
            (batch,), url + records_path(batch.tp), batch.request_body(core.transactional)
        )
    except Exception as exc:
        core.on_produce_error(batch, exc)
        return
    core.on_produce_ok(batch, body)


def produce_many(core: ProducerCore, url: str, batches: list[ProducerBatch]) -> Steps[None]:
    """Send the batches of several partitions led by the node at ``url`` in one request
    (``POST /v1/produce``). Each batch's entry of the answer settles it as its own
    request's answer would; an error of the whole request is every batch's error. A node
    of an earlier release knows no such path (404, nothing written): it is sent one batch
    per request for a while (``ProducerCore.single_batches_to``), these ones included."""
    for batch in batches:
        core.txn.on_batch_sent(batch.tp)
    try:
        answer = yield Produce(tuple(batches), url + PRODUCE_MANY_PATH, produce_many_body(
            batches, core.transactional))  # fmt: skip
        entries = answer["batches"]
        if len(entries) != len(batches):
            raise InternalError(f"{len(entries)} answers to {len(batches)} batches")
    except NotFoundError:
        core.single_batches_to(url)
        for batch in batches:
            yield from produce(core, batch)
        return
    except Exception as exc:
        for batch in batches:
            core.on_produce_error(batch, exc)
        return
    for batch, entry in zip(batches, entries, strict=True):
        error = entry.get("error")
        if error:
            core.on_produce_error(batch, error_from_body(error))
        else:
            core.on_produce_ok(batch, entry)


def produce_many_body(batches: list[ProducerBatch], transactional: bool) -> dict[str, Any]:
    return {
        "batches": [
            {"topic": b.tp.topic, "partition": b.tp.partition, **b.request_body(transactional)}
            for b in batches
        ]
    }


# --- the transactional calls -------------------------------------------------------------


def init_transactions(core: ProducerCore, timeout: TimeoutArg) -> Steps[None]:
    """Get the producer id and epoch, fencing any older producer with this id. A fatal
    error (fenced, or a transaction version the cluster lacks) ends the producer; any
    other leaves it INITIALIZING, to call again."""
    core.txn.begin_init()
    try:
        core.init_version = yield from transaction_version(core)
        try:
            body = yield txn_call(
                core, Req.INIT_TRANSACTIONS, "init", _init_body(core, False), timeout
            )
        except InvalidRequestError as exc:
            if not refused_field(exc, "transaction_version"):
                raise
            body = yield from _init_at_version_1(core, exc, timeout)
    except Exception as exc:
        core.txn.on_error(exc)
        raise
    _on_init(core, body)


def transaction_version(core: ProducerCore) -> Steps[int]:
    """The version init asks for. 1 needs no question: every release speaks it, and it is
    sent as the previous release's clients send it. Otherwise the cluster's features
    decide (``sdk._versions``)."""
    if core.config.transaction_version == TRANSACTION_VERSION_1:
        return TRANSACTION_VERSION_1
    features = yield from cluster_features(core)
    return choose_transaction_version(core.config.transaction_version, features)


def _init_at_version_1(core: ProducerCore, refusal: Exception, timeout: TimeoutArg) -> Steps[Any]:
    """The coordinator that owns the id refused ``transaction_version``: it is of an
    earlier release than the one whose features were read (coordinators upgraded one at
    a time). A producer that asked for no version speaks 1 with it; one that asked for
    this version cannot."""
    if core.config.transaction_version is not None:
        raise unsupported_transaction_version(
            core.init_version, PREVIOUS_RELEASE_FEATURES
        ) from refusal
    core.init_version = TRANSACTION_VERSION_1
    return (yield txn_call(core, Req.INIT_TRANSACTIONS, "init", _init_body(core, False), timeout))


def _init_body(core: ProducerCore, bump: bool) -> dict[str, Any]:
    """The init request, asking for the negotiated transaction version (version 1 sends
    no field at all: exactly the older clients' request)."""
    body = core.init_body(bump)
    if core.init_version != TRANSACTION_VERSION_1:
        body["transaction_version"] = core.init_version
    return body


def _on_init(core: ProducerCore, body: dict[str, Any]) -> None:
    """The version is the one the coordinator answered (an older one answers none: 1)."""
    core.on_init(body)
    core.txn.on_init_version(int(body.get("transaction_version", TRANSACTION_VERSION_1)))


def _complete_end(core: ProducerCore, answer: dict[str, Any] | None) -> None:
    """The end is done; under version 2 go on with the id and epoch it answered, every
    partition's sequence from 0 (nothing is in flight: commit flushed, abort waited)."""
    next_ids: tuple[int, int] | None = None
    if answer is not None and answer.get("producer_epoch") is not None:
        next_ids = (int(answer["producer_id"]), int(answer["producer_epoch"]))
    if core.txn.complete_end(next_ids):
        core.accumulator.reset_sequences()


def send_offsets_to_transaction(
    core: ProducerCore,
    offsets: Offsets,
    group: str | ConsumerGroupMetadata,
    timeout: TimeoutArg,
) -> Steps[None]:
    """AddOffsetsToTxn at the coordinator, then TxnOffsetCommit at the group's node. A
    failure makes the transaction abortable (fatal stays fatal): FENCED_MEMBER_EPOCH and
    UNKNOWN_MEMBER_ID (the member named by ``group``'s metadata lost the partitions) among
    them."""
    wanted = normalise_offsets(offsets)
    group_id = group if isinstance(group, str) else group.group_id
    core.txn.ensure_can_add_offsets()
    try:
        yield txn_call(
            core, Req.ADD_OFFSETS, "offsets", add_offsets_body(core, group, wanted), timeout
        )
        core.txn.on_offsets_added(group_id)
        yield Call(
            Req.TXN_OFFSET_COMMIT,
            "POST",
            group_path(group_id, "txn-offsets"),
            timeout_s=resolve_timeout(timeout, core.config.max_block_ms),
            body=core.txn_offsets_body(wanted),
            locate=lambda: group_node_url(core, group_id),
            invalidate=lambda _exc: core.metadata.invalidate_group(group_id),
        )
    except Exception as exc:
        core.on_request_error(exc)
        raise


def add_offsets_body(
    core: ProducerCore, group: str | ConsumerGroupMetadata, offsets: Iterable[TopicPartition]
) -> dict[str, Any]:
    """AddOffsetsToTxn's body. With a member's metadata it names the member, its epoch and
    the partitions whose offsets the transaction commits (KIP-447): the coordinator
    refuses them, and the commit, once that member no longer holds them. Metadata without
    a member (the consumer is joining, or was fenced) names none, which a group that has
    members refuses too."""
    if isinstance(group, str):
        return {**core.end_body(), "group_id": group}
    body: dict[str, Any] = {**core.end_body(), "group_id": group.group_id}
    if group.member_id is not None and group.member_epoch >= 1:
        body.update(
            member_id=group.member_id,
            member_epoch=group.member_epoch,
            partitions=[
                {"topic": tp.topic, "partition": tp.partition} for tp in sorted(set(offsets))
            ],
        )
    return body


def commit_transaction(core: ProducerCore, timeout: TimeoutArg) -> Steps[None]:
    """Flush, refuse the commit if a batch failed, then commit at the coordinator."""
    core.txn.begin_commit()
    yield Flush(resolve_timeout(timeout, core.config.max_block_ms))
    core.commit_outcome()
    answer: dict[str, Any] | None = None
    if core.txn.needs_end_call:
        try:
            answer = yield txn_call(core, Req.END_TXN, "commit", core.end_body(), timeout)
        except EosTimeoutError:
            raise  # still COMMITTING: calling commit_transaction again retries it
        except Exception as exc:
            core.on_request_error(exc)
            raise
    _complete_end(core, answer)


def abort_transaction(core: ProducerCore, timeout: TimeoutArg) -> Steps[None]:
    """Drop unsent records, wait for those in flight, abort at the coordinator; then, if
    a sequence number was left in doubt, bump the epoch (KIP-360)."""
    core.begin_abort()
    yield AwaitInFlight(
        core.accumulator.pending_done(), resolve_timeout(timeout, core.config.max_block_ms)
    )
    answer: dict[str, Any] | None = None
    if core.txn.needs_end_call:
        try:
            answer = yield txn_call(core, Req.END_TXN, "abort", core.end_body(), timeout)
        except InvalidTxnStateError:
            if core.txn.confirmed_at_coordinator:
                core.txn.to_fatal(InvalidTxnStateError("abort refused"))
                raise
            # nothing was confirmed added: there was no transaction to abort
        except EosTimeoutError:
            raise
        except Exception as exc:
            core.on_request_error(exc)
            raise
    _complete_end(core, answer)
    if core.state is ProducerState.INITIALIZING:
        body = yield txn_call(core, Req.INIT_TRANSACTIONS, "init", _init_body(core, True), timeout)
        _on_init(core, body)
