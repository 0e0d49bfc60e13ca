"""The workload processes of a Jepsen-style run, each one OS process on a client host.

    python -m tests.jepsen.workload producer --name p1 --bootstrap URLS --folder F --t0 T
    python -m tests.jepsen.workload copier   --name c1 ...
    python -m tests.jepsen.workload reader   --name r1 ...
    python -m tests.jepsen.workload final    --name final ...

* A **producer** runs transactions of unique values over two or three partitions of
  ``DATA_TOPIC``; about one in six is aborted on purpose after its records reached the log.
* A **copier** is a member of ``COPY_GROUP`` (subscribed, so the group coordinator hands
  out the partitions and fences a zombie, KIP-447): it copies what it polls into
  ``COPY_TOPIC`` with the input offsets in the same transaction.
* A **reader** polls every partition of both topics read_committed, from offset 0, for the
  whole run, and never goes back.
* **final** waits until no partition holds an undecided transaction, then reads every
  partition whole and the copiers' committed offsets.

``--pause-s`` paces them all: a producer and a copier pause that long after each
transaction, a reader after each poll that found records.

Each process records what it did (``history.py``) and stops when the run's stop file
appears. A client outlives every fault: an error it cannot classify makes it record the
transaction as in doubt (``info``) or failed and start a new producer with the same
transactional id, whose ``init_transactions`` settles what the old one left open, as an
application restarted by its supervisor would.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sdk import (
    AbortableError,
    AdminClient,
    Consumer,
    RetryConfig,
    TopicPartition,
    TransactionalProducer,
)
from tests.jepsen.history import (
    COPY_GROUP,
    COPY_TOPIC,
    DATA_TOPIC,
    Final,
    Intent,
    Outcome,
    Poll,
    Recorder,
    Txn,
    copy_value,
    tp,
)

#: Partitions of each topic of the run.
PARTITIONS = 4
#: A transaction left open by a client that lost its coordinator is aborted after this.
TRANSACTION_TIMEOUT_MS = 10_000
#: Fault runs want the client to notice a dead or paused peer quickly and try another.
RETRY = RetryConfig(backoff_ms=100, request_timeout_ms=10_000, coordinator_timeout_ms=3_000)


class Traced(httpx.BaseTransport):
    """The client's HTTP, with every failed, refused or slow request written to the
    process's log (stderr): what a client waited on during a fault, for the report's
    reader; the history records only outcomes."""

    SLOW_S = 1.0

    def __init__(self, now: Clock) -> None:
        self._inner = httpx.HTTPTransport()
        self._now = now

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = self._now()
        try:
            response = self._inner.handle_request(request)
        except Exception as exc:
            self._say(started, request, _short(exc))
            raise
        if response.status_code >= 400:
            response.read()
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = ""
            self._say(started, request, f"HTTP {response.status_code} {code}")
        elif self._now() - started > self.SLOW_S:
            self._say(started, request, f"HTTP {response.status_code}")
        return response

    def _say(self, started: float, request: httpx.Request, what: str) -> None:
        took = self._now() - started
        print(f"{started:9.3f} +{took:6.3f}s {request.method} {request.url}: {what}",
              file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        self._inner.close()


class Restart(Exception):
    """Start a new client instance: the old one's state is no longer known."""


class Clock:
    def __init__(self, t0: float) -> None:
        self.t0 = t0

    def __call__(self) -> float:
        return round(time.monotonic() - self.t0, 4)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _settle(txn: Txn, producer: TransactionalProducer, exc: BaseException, now: Clock) -> None:
    """After an error: abort if the producer may (the transaction is then certainly not
    committed), else record it as in doubt or failed and ask for a new instance."""
    txn.error = _short(exc)
    if isinstance(exc, AbortableError):
        try:
            producer.abort_transaction(timeout=20.0)
        except Exception as second:
            txn.error += f"; abort: {_short(second)}"
        else:
            txn.outcome = Outcome.ABORTED
            txn.end = now()
            return
    txn.outcome = Outcome.INFO if txn.commit_at is not None else Outcome.FAIL
    txn.end = now()
    raise Restart from exc


def _new_producer(name: str, stopping: Callable[[], bool]) -> TransactionalProducer | None:
    """A producer with ``name`` as its transactional id, initialised (retried until it
    is, or the run stops: the coordinators may all be out of reach for a while)."""
    while not stopping():
        producer = TransactionalProducer(
            ARGS.bootstrap, name, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS, linger_ms=2,
            max_block_ms=30_000, delivery_timeout_ms=30_000, retry=RETRY,
            transport=Traced(CLOCK),
        )  # fmt: skip
        try:
            producer.init_transactions(timeout=30.0)
            return producer
        except Exception:
            with contextlib.suppress(Exception):
                producer.close(timeout=1.0)
            time.sleep(0.5)
    return None


def _close(producer: TransactionalProducer | None) -> None:
    if producer is not None:
        with contextlib.suppress(Exception):
            producer.close(timeout=1.0)


def producer_loop(recorder: Recorder, now: Clock, stopping: Callable[[], bool]) -> None:
    name = ARGS.name
    rng = random.Random(f"{ARGS.seed}-{name}")
    seq = 0
    while not stopping():
        producer = _new_producer(name, stopping)
        try:
            while producer is not None and not stopping():
                seq += 1
                txn = Txn(
                    process=name, txn=f"{name}.{seq}", kind="produce",
                    intent=Intent.ABORT if rng.random() < 1 / 6 else Intent.COMMIT,
                    start=now(), end=0.0, outcome=Outcome.FAIL,
                )  # fmt: skip
                try:
                    _produce(producer, txn, rng, now)
                finally:
                    recorder.record(txn)
                time.sleep(ARGS.pause_s)
        except Restart:
            pass
        finally:
            _close(producer)


def _decide(
    producer: TransactionalProducer, txn: Txn, futures: list[tuple[str, Any]], now: Clock
) -> None:
    """The end of a transaction: every send acknowledged (its offset recorded), then the
    commit, or the abort it was meant for; ``commit_at`` marks the request going out."""
    producer.flush(timeout=30.0)
    for value, future in futures:
        txn.acked[value] = future.result(timeout=0).offset
    txn.commit_at = now()
    if txn.intent is Intent.ABORT:
        producer.abort_transaction(timeout=30.0)
        txn.outcome = Outcome.ABORTED
    else:
        producer.commit_transaction(timeout=30.0)
        txn.outcome = Outcome.OK
    txn.end = now()


def _produce(producer: TransactionalProducer, txn: Txn, rng: random.Random, now: Clock) -> None:
    partitions = rng.sample(range(PARTITIONS), k=rng.randint(2, 3))
    try:
        producer.begin_transaction()
        futures = []
        for index, partition in enumerate(partitions):
            value = f"{txn.txn}.{index}"
            txn.writes.append((DATA_TOPIC, partition, value))
            futures.append((value, producer.send(DATA_TOPIC, value, partition=partition)))
        _decide(producer, txn, futures, now)
    except Exception as exc:
        _settle(txn, producer, exc, now)


def copier_loop(recorder: Recorder, now: Clock, stopping: Callable[[], bool]) -> None:
    name = ARGS.name
    rng = random.Random(f"{ARGS.seed}-{name}")
    seq = 0
    while not stopping():
        producer = _new_producer(name, stopping)
        consumer = Consumer(ARGS.bootstrap, COPY_GROUP, max_poll_records=25,
                            fetch_max_wait_ms=200, retry=RETRY,
                            transport=Traced(CLOCK))  # fmt: skip
        try:
            consumer.subscribe([DATA_TOPIC])
            while producer is not None and not stopping():
                try:
                    records = consumer.poll(timeout=0.5)
                except Exception as exc:
                    raise Restart from exc
                if not records:
                    continue
                seq += 1
                txn = Txn(
                    process=name, txn=f"{name}.{seq}", kind="copy",
                    intent=Intent.ABORT if rng.random() < 1 / 8 else Intent.COMMIT,
                    start=now(), end=0.0, outcome=Outcome.FAIL,
                    reads=[(r.topic, r.partition, r.offset, str(r.value)) for r in records],
                )  # fmt: skip
                try:
                    _copy(producer, consumer, txn, now)
                finally:
                    recorder.record(txn)
                if txn.outcome is not Outcome.OK:
                    _rewind(consumer, txn)
                time.sleep(ARGS.pause_s)
        except Restart:
            pass
        finally:
            _close(producer)
            with contextlib.suppress(Exception):
                consumer.close()


def _copy(producer: TransactionalProducer, consumer: Consumer, txn: Txn, now: Clock) -> None:
    try:
        producer.begin_transaction()
        futures = []
        next_offsets: dict[TopicPartition, int] = {}
        for topic, partition, offset, value in txn.reads:
            copy = copy_value(txn.txn, value)
            txn.writes.append((COPY_TOPIC, partition, copy))
            futures.append((copy, producer.send(COPY_TOPIC, copy, partition=partition)))
            next_offsets[TopicPartition(topic, partition)] = offset + 1
        txn.offsets = {tp(t.topic, t.partition): o for t, o in next_offsets.items()}
        producer.send_offsets_to_transaction(next_offsets, consumer.group_metadata())
        _decide(producer, txn, futures, now)
    except Exception as exc:
        _settle(txn, producer, exc, now)


def _rewind(consumer: Consumer, txn: Txn) -> None:
    """Read an aborted transaction's input again (where the partition is still ours)."""
    first: dict[TopicPartition, int] = {}
    for topic, partition, offset, _ in txn.reads:
        first.setdefault(TopicPartition(topic, partition), offset)
    owned = consumer.assignment()
    for part, offset in first.items():
        if part in owned:
            with contextlib.suppress(Exception):
                consumer.seek(part, offset)


def _all_partitions() -> list[TopicPartition]:
    return [TopicPartition(t, p) for t in (DATA_TOPIC, COPY_TOPIC) for p in range(PARTITIONS)]


def _reader(positions: dict[TopicPartition, int]) -> Consumer:
    consumer = Consumer(ARGS.bootstrap, None, max_poll_records=2000, fetch_max_wait_ms=500,
                        retry=RETRY, transport=Traced(CLOCK))  # fmt: skip
    consumer.assign(list(positions))
    for part, offset in positions.items():
        consumer.seek(part, offset)
    return consumer


def reader_loop(recorder: Recorder, now: Clock, stopping: Callable[[], bool]) -> None:
    """Poll all the time; after an error go on from the positions reached (a new
    consumer), never from earlier."""
    positions = dict.fromkeys(_all_partitions(), 0)
    consumer = _reader(positions)
    try:
        while not stopping():
            started = now()
            try:
                records = consumer.poll(timeout=0.3)
            except Exception as exc:
                recorder.record(Poll(ARGS.name, started, now(), error=_short(exc)))
                with contextlib.suppress(Exception):
                    consumer.close()
                time.sleep(0.2)
                consumer = _reader(positions)
                continue
            if records:
                rows = [(r.topic, r.partition, r.offset, str(r.value)) for r in records]
                recorder.record(Poll(ARGS.name, started, now(), records=rows))
                for r in records:
                    positions[TopicPartition(r.topic, r.partition)] = r.offset + 1
                time.sleep(ARGS.pause_s)
    finally:
        with contextlib.suppress(Exception):
            consumer.close()


def final_read(recorder: Recorder, now: Clock, deadline_s: float) -> int:
    """Wait until every partition's last stable offset reached its high watermark (no
    transaction left undecided), then read everything read_committed."""
    deadline = time.monotonic() + deadline_s
    parts = _all_partitions()
    ends: dict[TopicPartition, int] = {}
    with AdminClient(ARGS.bootstrap, retry=RETRY) as admin:
        for part in parts:
            while True:
                try:
                    offsets = admin.list_offsets(part, timeout=10.0)
                except Exception as exc:
                    if time.monotonic() > deadline:
                        print(f"final: {part} unreachable: {_short(exc)}", file=sys.stderr)
                        return 2
                    time.sleep(0.5)
                    continue
                if offsets.last_stable_offset >= offsets.high_watermark:
                    ends[part] = offsets.last_stable_offset
                    break
                if time.monotonic() > deadline:
                    # a transaction no marker will ever end (a bug): read what is stable,
                    # and let the checker say what is missing
                    print(f"final: {part} still undecided: {offsets}", file=sys.stderr)
                    ends[part] = offsets.last_stable_offset
                    break
                time.sleep(0.5)
    event = Final(ARGS.name, now())
    event.end_offsets = {tp(p.topic, p.partition): offset for p, offset in ends.items()}
    positions = dict.fromkeys(parts, 0)
    consumer = _reader(positions)
    deadline = time.monotonic() + deadline_s
    try:
        while any(positions[p] < ends[p] for p in parts):
            if time.monotonic() > deadline:
                print(f"final: read stopped short: {positions} of {ends}", file=sys.stderr)
                return 2
            for r in consumer.poll(timeout=1.0):
                part = TopicPartition(r.topic, r.partition)
                if r.offset < ends[part]:
                    event.records.append((r.topic, r.partition, r.offset, str(r.value)))
            positions = {p: consumer.position(p) for p in parts}
    finally:
        consumer.close()
    with Consumer(ARGS.bootstrap, COPY_GROUP, retry=RETRY) as group:
        inputs = [p for p in parts if p.topic == DATA_TOPIC]
        try:  # require_stable: waits while a transaction holds pending offsets
            committed = group.committed(inputs, timeout=min(60.0, deadline_s))
        except Exception as exc:  # pending for good (a bug): the checker reports it
            event.offsets_error = _short(exc)
            committed = {}
    event.committed_offsets = {
        tp(p.topic, p.partition): meta.offset for p, meta in committed.items() if meta is not None
    }
    recorder.record(event)
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=("producer", "copier", "reader", "final"))
    parser.add_argument("--name", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--folder", required=True, type=Path)
    parser.add_argument("--t0", required=True, type=float, help="the run's monotonic start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause-s", type=float, default=0.05,
                        help="between transactions, and a reader's polls that found records")
    parser.add_argument("--deadline-s", type=float, default=120.0, help="final: how long")
    return parser.parse_args(argv)


ARGS: argparse.Namespace
CLOCK: Clock


def main(argv: list[str]) -> int:
    global ARGS, CLOCK
    ARGS = parse(argv)
    now = CLOCK = Clock(ARGS.t0)
    stop = ARGS.folder / "stop"
    recorder = Recorder(ARGS.folder / f"{ARGS.name}.jsonl")
    (ARGS.folder / f"{ARGS.name}.started").touch()  # the run's warmup counts from here
    try:
        if ARGS.role == "final":
            return final_read(recorder, now, ARGS.deadline_s)
        loop = {"producer": producer_loop, "copier": copier_loop, "reader": reader_loop}
        loop[ARGS.role](recorder, now, stop.exists)
        return 0
    finally:
        recorder.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
