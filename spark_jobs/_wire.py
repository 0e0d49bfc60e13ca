"""Low-level transaction calls for a transaction shared by many Spark tasks.

The SDK's ``TransactionalProducer`` owns its transaction from one process: it adds a
partition when it first sends to it, and numbers its own batches. The data source's
writes (``spark_jobs.datasource``, and ``spark_jobs.writer.write_atomic`` built on them)
split one transaction across processes instead: the driver opens it, and each executor
task adds the partitions it writes and produces its batches under the driver's producer
id and epoch, in a sequence space of its own (a slot), with sequence numbers it derives
from the records' deterministic order. Neither half fits the SDK's producer, so this module
makes those wire calls itself (docs/design.md §4) on the SDK's transport, retry table, metadata
cache and request paths, so the retry rules stay the SDK's:

* ``TransactionSession`` (driver): init, add partitions, add offsets plus TxnOffsetCommit,
  commit and abort of one transactional id.
* ``SequencedPartitionWriter`` (executor): the producer's last sequence on a partition
  (``last_sequence``), or on many (partition, slot) pairs with one request per leader node
  (``last_sequences``), and ``produce`` one batch with a given producer id, epoch and base
  sequence.
* ``init_producer_id`` (executor): an idempotent producer id, for the at-least-once job.
* ``PartitionFetcher`` (executor): the read of a planned offset range of a partition
  (``fetch_range``), answered as the node's JSON a fetch at a time; the data source's
  read tasks turn it into Arrow batches, the pipeline's tasks into records.

The pipeline's tasks (``spark_jobs.batch_writer``) use the same two halves from one
process: a ``TransactionSession`` per source partition, and batches of thousands of records
numbered by the task, instead of the SDK producer's per-record ``send``, whose bookkeeping
(a future and a lock per record) costs more than the copying itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from eos_protocol.common import read_answer
from eos_protocol.coordinator import AddPartitionsResponse, ProducerIdResponse
from eos_protocol.errors import InternalError, error_for
from eos_protocol.node import (
    MAX_DESCRIBE_ENTRIES,
    DescribeProducersManyResponse,
    DescribeProducersResponse,
    ProducerDescription,
    ProduceResponse,
)
from sdk._config import RetryConfig
from sdk._metadata import (
    DESCRIBE_PRODUCERS_MANY_PATH,
    MetadataCache,
    find_coordinator_params,
    group_path,
    partition_path,
    records_path,
    topic_path,
    txn_path,
)
from sdk._transport import (
    POLICIES,
    UNKNOWN_OUTCOME,
    Req,
    SyncTransport,
    Verdict,
    attempt_timeout_s,
    backoff_s,
    classify,
    error_from_body,
    parse_response,
)
from sdk._types import TopicPartition

#: How long one logical call may keep retrying (seconds).
CALL_TIMEOUT_S = 60.0

#: A range read that makes no progress for this long fails (the partition's node is gone).
STALL_TIMEOUT_S = 60.0

#: The most bytes one fetch of a range read asks for.
FETCH_MAX_BYTES = 4 * 1024 * 1024

#: No batch of this producer on the partition yet (its next sequence is 0).
NO_SEQUENCE = -1

#: A partition and the slot asked about in it (None: no slot, which is slot 0).
SlotKey = tuple[TopicPartition, int | None]
#: How long a node that answered the request of many partitions' producers with 404 or
#: 405 (a release without it) is asked one partition per request.
PER_PARTITION_FOR_S = 60.0
#: The answers of a node that has no such request: no route (404), or a route of that
#: path with other methods only (405).
_NOT_SERVED = frozenset({404, 405})


@dataclass(frozen=True)
class ProducerIdentity:
    """The producer id and epoch every batch of a shared transaction carries."""

    producer_id: int
    producer_epoch: int


class _Client:
    """A transport and a metadata cache: what both halves need to find their targets."""

    def __init__(self, bootstrap_url: str, retry: RetryConfig | None) -> None:
        self.metadata = MetadataCache(bootstrap_url)
        self.http = SyncTransport(retry or RetryConfig())
        self.http.on_unreachable = self.metadata.unreachable

    def bootstrap(self) -> str:
        return self.http.bootstrap(self.metadata)

    def leader(self, tp: TopicPartition) -> str:
        url = self.metadata.leader(tp)
        if url is None:
            body = self.http.call(
                Req.TOPIC, "GET", topic_path(tp.topic), base=self.bootstrap,
                timeout_s=CALL_TIMEOUT_S,
            )
            self.metadata.update_topic(body)
            url = self.metadata.leader(tp)
            assert url is not None
        return url

    def close(self) -> None:
        self.http.close()


class TransactionSession(_Client):
    """One transactional id's transaction, driven by hand (the driver's half).

    Every ``init`` bumps the epoch: a write starts with one, so that its tasks can number
    their batches from 0 on every partition (the node keeps sequences per producer and
    partition across the transactions of one epoch), and so that any task of an earlier
    write that is still running is fenced.
    """

    def __init__(
        self,
        bootstrap_url: str,
        transactional_id: str,
        *,
        transaction_timeout_ms: int = 60_000,
        retry: RetryConfig | None = None,
    ) -> None:
        super().__init__(bootstrap_url, retry)
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.identity: ProducerIdentity | None = None

    def _coordinator(self) -> str:
        url = self.metadata.txn_coordinator
        if url is None:
            body = self.http.call(
                Req.FIND_COORDINATOR, "GET", "/v1/coordinators", base=self.bootstrap,
                params=find_coordinator_params(self.transactional_id, "transaction"),
                timeout_s=CALL_TIMEOUT_S,
            )
            url = self.metadata.txn_coordinator = str(body["url"]).rstrip("/")
        return url

    def _call(self, req: Req, action: str, body: dict[str, Any]) -> Any:
        return self.http.call(
            req, "POST", txn_path(self.transactional_id, action), base=self._coordinator,
            json=body, timeout_s=CALL_TIMEOUT_S,
            invalidate=self.metadata.invalidate_txn_coordinator,
        )

    def _id_body(self) -> dict[str, Any]:
        if self.identity is None:
            raise RuntimeError("init() first")
        return {
            "producer_id": self.identity.producer_id,
            "producer_epoch": self.identity.producer_epoch,
        }

    def init(self) -> ProducerIdentity:
        """A new epoch for this transactional id; aborts whatever it left open."""
        body = self._call(
            Req.INIT_TRANSACTIONS, "init",
            {"transaction_timeout_ms": self.transaction_timeout_ms},
        )
        answer = read_answer(ProducerIdResponse, body)
        self.identity = ProducerIdentity(answer.producer_id, answer.producer_epoch)
        return self.identity

    def add_partitions(self, partitions: Sequence[TopicPartition]) -> None:
        """Add the partitions the tasks will write (KIP-890: the node checks this)."""
        if not partitions:
            return
        body = self._call(
            Req.ADD_PARTITIONS, "partitions",
            {
                **self._id_body(),
                "partitions": [{"topic": t, "partition": p} for t, p in sorted(partitions)],
            },
        )
        for result in read_answer(AddPartitionsResponse, body).partitions:
            if result.error:
                raise error_for(result.error, f"adding {result.topic}-{result.partition} failed")

    def add_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` (next offsets to read) for ``group_id`` with this transaction."""
        if not offsets:
            return
        self._call(Req.ADD_OFFSETS, "offsets", {**self._id_body(), "group_id": group_id})
        node = self.http.call(
            Req.FIND_COORDINATOR, "GET", "/v1/coordinators", base=self.bootstrap,
            params=find_coordinator_params(group_id, "group"), timeout_s=CALL_TIMEOUT_S,
        )
        url = str(node["url"]).rstrip("/")
        self.http.call(
            Req.TXN_OFFSET_COMMIT, "POST", group_path(group_id, "txn-offsets"),
            base=lambda: url,
            json={
                "transactional_id": self.transactional_id,
                **self._id_body(),
                "offsets": [
                    {"topic": tp.topic, "partition": tp.partition, "offset": offset}
                    for tp, offset in sorted(offsets.items())
                ],
            },
            timeout_s=CALL_TIMEOUT_S,
        )

    def commit(self) -> None:
        self._call(Req.END_TXN, "commit", self._id_body())

    def abort(self) -> None:
        self._call(Req.END_TXN, "abort", self._id_body())


class SequencedPartitionWriter(_Client):
    """Produces batches with sequence numbers chosen by the caller (the tasks' half).

    A task that owns a target partition numbers its records 0, 1, 2, … in their sorted
    order and cuts them into batches the same way on every attempt, so a batch of a retried
    or speculative attempt has exactly the sequences, and the records, of the first
    attempt's batch: the node answers it as a duplicate. The node only remembers the last
    five batches of a producer, so an attempt first asks how far the partition got
    (``last_sequence``) and skips the batches already written.
    """

    def __init__(
        self, bootstrap_url: str, identity: ProducerIdentity, retry: RetryConfig | None = None
    ) -> None:
        super().__init__(bootstrap_url, retry)
        self.identity = identity
        self._per_partition_until: dict[str, float] = {}  # node URL -> monotonic time

    def last_sequence(self, tp: TopicPartition, *, slot: int | None = None) -> int:
        """The last sequence this producer (at this epoch) wrote to ``tp`` — in ``slot``,
        when the writer numbers its batches in one (see ``produce``) — or -1."""
        body = self.http.call(
            Req.DESCRIBE_PRODUCERS, "GET",
            partition_path(tp, "producers"),
            base=lambda: self.leader(tp), timeout_s=CALL_TIMEOUT_S,
            params=None if slot is None else {"slot": slot},
            invalidate=lambda _exc: self.metadata.invalidate_topic(tp.topic),
        )
        return self._own_sequence(read_answer(DescribeProducersResponse, body).producers)

    def _own_sequence(self, producers: Iterable[ProducerDescription]) -> int:
        """This producer's last sequence among a partition's rows: -1 when it has no row
        there, or a row of another epoch (its sequences start again at a new epoch)."""
        for entry in producers:
            if entry.producer_id == self.identity.producer_id:
                if entry.producer_epoch != self.identity.producer_epoch:
                    return NO_SEQUENCE
                return entry.last_sequence
        return NO_SEQUENCE

    def last_sequences(self, wanted: Iterable[SlotKey]) -> dict[SlotKey, int]:
        """``last_sequence`` of every (partition, slot) in ``wanted``, with one request per
        leader node (``POST /v1/producers/describe``) instead of one per partition: a
        commit of thousands of partitions asks a handful of nodes.

        Each entry is retried by DescribeProducers' row of the retry table until
        ``CALL_TIMEOUT_S``, alone: a partition whose leader moved (its entry answered
        ``NOT_LEADER_OR_FOLLOWER``) is looked up again and asked of its new leader in the
        next round, while the others are settled. A node that answers the request 404 or
        405 (a release without it, during a rolling upgrade) is asked per partition, as
        ``last_sequence`` asks, for ``PER_PARTITION_FOR_S``."""
        pending = list(dict.fromkeys(wanted))
        found: dict[SlotKey, int] = {}
        policy = POLICIES[Req.DESCRIBE_PRODUCERS]
        deadline = time.monotonic() + CALL_TIMEOUT_S
        attempt = 0
        while pending:
            attempt += 1
            failures = self._describe_round(pending, found)
            pending = []
            last: BaseException | None = None
            for key, exc in failures.items():
                verdict = classify(policy, exc)
                if verdict is Verdict.FAIL or time.monotonic() >= deadline:
                    raise exc
                if verdict is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME):
                    self.metadata.invalidate_topic(key[0].topic)
                pending.append(key)
                last = exc
            if last is not None:
                time.sleep(backoff_s(last, attempt, self.http.retry))
        return found

    def _describe_round(
        self, pending: list[SlotKey], found: dict[SlotKey, int]
    ) -> dict[SlotKey, BaseException]:
        """One attempt of every pending entry, one request per leader node (or per
        ``MAX_DESCRIBE_ENTRIES`` entries of it); the errors, by entry."""
        failures: dict[SlotKey, BaseException] = {}
        by_node: dict[str, list[SlotKey]] = {}
        for key in pending:
            try:
                by_node.setdefault(self.leader(key[0]), []).append(key)
            except Exception as exc:
                failures[key] = exc
        for url, keys in by_node.items():
            for start in range(0, len(keys), MAX_DESCRIBE_ENTRIES):
                chunk = keys[start : start + MAX_DESCRIBE_ENTRIES]
                now = time.monotonic()
                if self._per_partition_until.get(url, 0.0) <= now:
                    try:
                        failures.update(self._describe_together(url, chunk, found))
                        continue
                    except _NotServed:
                        self._per_partition_until[url] = now + PER_PARTITION_FOR_S
                for tp, slot in chunk:
                    found[(tp, slot)] = self.last_sequence(tp, slot=slot)
        return failures

    def _describe_together(
        self, url: str, keys: list[SlotKey], found: dict[SlotKey, int]
    ) -> dict[SlotKey, BaseException]:
        """One request for ``keys`` to the node at ``url``: each entry's last sequence
        into ``found``, or its error into the answer (a failed request is every entry's).
        Raises ``_NotServed`` when the node has no such request."""
        body = {"partitions": [_describe_entry(tp, slot) for tp, slot in keys]}
        try:
            response = self.http.client.post(
                url + DESCRIBE_PRODUCERS_MANY_PATH, content=orjson.dumps(body),
                timeout=attempt_timeout_s(POLICIES[Req.DESCRIBE_PRODUCERS], self.http.retry),
            )  # fmt: skip
            if response.status_code in _NOT_SERVED:
                raise _NotServed(url)
            answer = read_answer(DescribeProducersManyResponse, parse_response(response))
            if len(answer.partitions) != len(keys):
                raise InternalError(f"{len(answer.partitions)} answers to {len(keys)} entries")
        except _NotServed:
            raise
        except Exception as exc:
            return dict.fromkeys(keys, exc)
        failures: dict[SlotKey, BaseException] = {}
        for key, entry in zip(keys, answer.partitions, strict=True):
            if entry.error is not None:
                failures[key] = error_from_body(entry.error.model_dump(exclude_none=True))
            else:
                found[key] = self._own_sequence(entry.producers)
        return failures

    def produce(
        self,
        tp: TopicPartition,
        base_sequence: int,
        records: Sequence[dict[str, Any]],
        *,
        transactional: bool = True,
        encoding: str = "utf8",
        slot: int | None = None,
    ) -> ProduceResponse:
        """One batch at ``base_sequence`` (records shaped as the wire's ``RecordIn``;
        transactional unless told otherwise); a duplicate is a success. Produce requests
        are not retried by the transport (the SDK's sender reschedules them), so the retry
        loop is here, on the same verdicts: a resend keeps its sequence, so it can only
        ever be a duplicate.

        ``slot`` numbers the batch in one of the producer's sequence spaces: the tasks of
        one transaction that share a producer id and epoch each write in their own slot,
        from sequence 0, and never collide. Left out of the body when None, so a node of
        a release without slots takes every call that does not use one."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        attempt = 0
        while True:
            attempt += 1
            try:
                return self.produce_once(
                    tp, base_sequence, records, transactional=transactional,
                    encoding=encoding, slot=slot,
                )  # fmt: skip
            except Exception as exc:
                verdict = classify(POLICIES[Req.PRODUCE], exc)
                if verdict is Verdict.FAIL or time.monotonic() >= deadline:
                    raise
                if verdict is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME):
                    self.metadata.invalidate_topic(tp.topic)
                time.sleep(backoff_s(exc, attempt, self.http.retry))

    def produce_once(
        self,
        tp: TopicPartition,
        base_sequence: int,
        records: Sequence[dict[str, Any]],
        *,
        transactional: bool = True,
        encoding: str = "utf8",
        slot: int | None = None,
    ) -> ProduceResponse:
        """One attempt of ``produce``, its error raised as it came (the caller retries)."""
        body = self.produce_body(
            base_sequence, records, transactional=transactional, encoding=encoding, slot=slot
        )
        answer = self.http.send_once("POST", self.leader(tp) + records_path(tp), json=body)
        return read_answer(ProduceResponse, answer)

    def produce_body(
        self,
        base_sequence: int,
        records: Sequence[dict[str, Any]],
        *,
        transactional: bool,
        encoding: str,
        slot: int | None,
    ) -> dict[str, Any]:
        """A batch's produce body (``slot`` and a utf8 ``encoding`` left out: a node of a
        release without them takes every call that does not use them)."""
        body: dict[str, Any] = {
            "producer_id": self.identity.producer_id,
            "producer_epoch": self.identity.producer_epoch,
            "base_sequence": base_sequence,
            "transactional": transactional,
            "records": records,
        }
        if encoding != "utf8":
            body["encoding"] = encoding
        if slot is not None:
            body["slot"] = slot
        return body

    def partition_count(self, topic: str) -> int:
        count = self.metadata.partition_count(topic)
        if count is None:
            self.leader(TopicPartition(topic, 0))
            count = self.metadata.partition_count(topic)
            assert count is not None
        return count


class PartitionFetcher(_Client):
    """Fetches of one reader, with the SDK's retry rule for fetches (a stale leader is
    looked up again). The answer is the node's JSON body, left for the caller to decode:
    the SDK's consumer builds each record through per-record calls, which a task reading
    millions of records can spare."""

    def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_records: int,
        max_bytes: int = FETCH_MAX_BYTES,
        read_committed: bool = True,
    ) -> dict[str, Any]:
        """``GET .../records`` from ``offset`` (no long poll: a reader asks only below the
        last stable offset it planned)."""
        params = {
            "offset": offset,
            "max_records": max_records,
            "max_bytes": max_bytes,
            "isolation_level": "read_committed" if read_committed else "read_uncommitted",
            "max_wait_ms": 0,
        }
        body: dict[str, Any] = self.http.call(
            Req.FETCH, "GET", records_path(tp), base=lambda: self.leader(tp), params=params,
            timeout_s=CALL_TIMEOUT_S,
            invalidate=lambda _exc: self.metadata.invalidate_topic(tp.topic),
        )
        return body

    def fetch_range(
        self,
        tp: TopicPartition,
        start: int,
        end: int,
        *,
        max_records: int,
        max_bytes: int = FETCH_MAX_BYTES,
        read_committed: bool = True,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Iterator[list[dict[str, Any]]]:
        """The records of ``tp`` at offsets ``[start, end)`` as the node's JSON, one list
        per answer (the records at or past ``end`` left out; an answer with none left
        yields nothing). Every Spark read of a planned range goes through here: the data
        source's tasks and the pipeline's ``RangeReader``.

        The read moves to each answer's ``next_offset``, past markers and aborted batches,
        so it ends at ``end`` even when the last offsets hold no visible record: below the
        last stable offset the driver planned with, every attempt reads the same records.
        An answer that moves nothing is asked again after a pause; ``STALL_TIMEOUT_S``
        without progress fails the read (the partition's node is gone)."""
        offset, last_progress = start, time.monotonic()
        while offset < end and not stopped():
            body = self.fetch(
                tp, offset, max_records=min(max_records, end - offset), max_bytes=max_bytes,
                read_committed=read_committed,
            )
            records = records_below(body["records"], end)
            if records:
                yield records
            following = max(offset, int(body["next_offset"]))
            if following > offset:
                offset, last_progress = following, time.monotonic()
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise TimeoutError(
                    f"{tp.topic}-{tp.partition}: no progress at {offset} (end {end})"
                )
            else:
                time.sleep(0.05)


def records_below(records: list[dict[str, Any]], end: int) -> list[dict[str, Any]]:
    """A fetch answer's records before offset ``end`` (the same list when all are)."""
    if records and records[-1]["offset"] >= end:
        return [r for r in records if r["offset"] < end]
    return records


class _NotServed(Exception):
    """A node answered the request of many partitions' producers 404 or 405."""


def _describe_entry(tp: TopicPartition, slot: int | None) -> dict[str, Any]:
    """An entry of ``POST /v1/producers/describe`` (no ``slot`` when None: slot 0)."""
    entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition}
    if slot is not None:
        entry["slot"] = slot
    return entry


def init_producer_id(bootstrap_url: str, retry: RetryConfig | None = None) -> ProducerIdentity:
    """A new idempotent producer id (``POST /v1/producers``): the at-least-once job's
    tasks number their batches under it, so a resent batch is a duplicate, but a retried
    task, with a new id, writes its output again (what at-least-once means)."""
    return request_producer_id(_Client(bootstrap_url, retry))


def request_producer_id(client: _Client) -> ProducerIdentity:
    """``init_producer_id`` on a client the caller made (with its credentials); closes it."""
    try:
        body = client.http.call(
            Req.INIT_PRODUCER_ID, "POST", "/v1/producers", base=client.bootstrap, json={},
            timeout_s=CALL_TIMEOUT_S,
        )
    finally:
        client.close()
    answer = read_answer(ProducerIdResponse, body)
    return ProducerIdentity(answer.producer_id, answer.producer_epoch)
