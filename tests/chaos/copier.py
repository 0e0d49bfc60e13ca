"""A transactional copier: one OS process per input partition, so SIGKILL and SIGSTOP are
real. Run as ``python -m tests.chaos.copier ...`` by the workload.

It copies its input partition into the same partition of the output topic with
consume-transform-produce: read (read_committed) from the group's committed offset, send
the records and the next input offset in one transaction, commit; about one transaction
in ``--abort-every`` is aborted on purpose after its records reached the log (flushed), so
read_committed really has something to hide. Every step goes to the history file first
(see ``history.py``): ``begin`` before the first send, ``commit_start`` before the commit
request, ``commit_ok`` after its answer.

Errors: an abortable one aborts and rewinds to the transaction's first record; a fenced
producer (a newer instance took the transactional id, or the coordinator timed the
transaction out) exits with ``EXIT_FENCED``; anything else exits with ``EXIT_ERROR``, and
the workload starts a new instance with the same transactional id.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from pathlib import Path

from sdk import (
    AbortableError,
    Consumer,
    ConsumerRecord,
    InvalidProducerEpochError,
    ProducerFencedError,
    RetryConfig,
    TopicPartition,
    TransactionalProducer,
)
from tests.chaos.history import HistoryWriter, OutputValue

EXIT_DONE = 0
EXIT_FENCED = 3
EXIT_ERROR = 4
FENCED = (ProducerFencedError, InvalidProducerEpochError)


class Copier:
    def __init__(self, args: argparse.Namespace, history: HistoryWriter) -> None:
        self.args = args
        self.history = history
        self.tp = TopicPartition(args.input, args.partition)
        self.rng = random.Random(f"{args.seed}-{args.partition}-{args.instance}")
        self.producer = TransactionalProducer(
            args.url,
            args.tid,
            transaction_timeout_ms=args.timeout_ms,
            linger_ms=2,
            max_block_ms=args.max_block_ms,
            delivery_timeout_ms=args.max_block_ms,
            retry=RetryConfig(coordinator_timeout_ms=args.coordinator_timeout_ms),
        )
        self.consumer = Consumer(
            args.url, args.group, max_poll_records=args.txn_max, fetch_max_wait_ms=100,
            retry=RetryConfig(coordinator_timeout_ms=args.coordinator_timeout_ms),
        )
        self.buffer: list[ConsumerRecord] = []
        self.txn = 0

    def run(self) -> int:
        self.producer.init_transactions()
        self.history.write(
            "init",
            producer_id=self.producer.producer_id,
            producer_epoch=self.producer.producer_epoch,
        )
        self.consumer.assign([self.tp])
        # committed offsets with require_stable: never ahead of a pending transaction
        self.history.write("position", offset=self.consumer.position(self.tp))
        while True:
            batch = self._next_batch(self.rng.randint(self.args.txn_min, self.args.txn_max))
            if not batch:
                self.history.write("done")
                return EXIT_DONE
            self.txn += 1
            self._transaction(batch, abort=self.rng.random() < 1 / self.args.abort_every)

    def _next_batch(self, size: int) -> list[ConsumerRecord]:
        """The next ``size`` input records (fewer at the end of the input)."""
        while len(self.buffer) < size:
            upto = self.buffer[-1].offset + 1 if self.buffer else self.consumer.position(self.tp)
            if upto >= self.args.end:
                break
            self.buffer.extend(self.consumer.poll(timeout=0.5))
        batch, self.buffer = self.buffer[:size], self.buffer[size:]
        return batch

    def _pace(self, records: int, started: float) -> None:
        """With ``--pace``, hold the transaction open until it has taken as long as its
        records take at that rate: a short run then stays busy long enough for every
        injection to find copiers inside their transactions."""
        if self.args.pace > 0:
            time.sleep(max(0.0, started + records / self.args.pace - time.monotonic()))

    def _rewind(self, batch: list[ConsumerRecord]) -> None:
        self.buffer = []
        self.consumer.seek(self.tp, batch[0].offset)

    def _transaction(self, batch: list[ConsumerRecord], *, abort: bool) -> None:
        args, txn = self.args, self.txn
        self.history.write(
            "begin", txn=txn, abort=abort, first=batch[0].offset, last=batch[-1].offset
        )
        started = time.monotonic()
        try:
            self.producer.begin_transaction()
            for record in batch:
                value = OutputValue(
                    args.partition,
                    record.offset,
                    args.partition,
                    args.instance,
                    txn,
                    abort,
                    str(record.value),
                )
                self.producer.send(
                    args.output, value.encode(), key=record.key, partition=args.partition
                )
            self.producer.send_offsets_to_transaction({self.tp: batch[-1].offset + 1}, args.group)
            self._pace(len(batch), started)
            if abort:
                self.producer.flush()  # the records reach the log before the abort
                self.history.write("abort_start", txn=txn)
                self.producer.abort_transaction()
                self.history.write("abort_ok", txn=txn)
                self._rewind(batch)
            else:
                self.history.write("commit_start", txn=txn)
                self.producer.commit_transaction()
                self.history.write("commit_ok", txn=txn)
        except AbortableError as exc:
            self.history.write("error", txn=txn, kind=type(exc).__name__, message=str(exc))
            self.producer.abort_transaction()
            self.history.write("abort_ok", txn=txn)
            self._rewind(batch)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--url", "--input", "--output", "--group", "--tid", "--history"):
        parser.add_argument(flag, required=True)
    for flag in ("--partition", "--instance", "--end", "--txn-min", "--txn-max"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--abort-every", type=int, default=3)
    parser.add_argument("--timeout-ms", type=int, default=15_000)
    parser.add_argument("--max-block-ms", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.0, help="records/s, 0: no limit")
    parser.add_argument("--coordinator-timeout-ms", type=int, default=5_000)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    history = HistoryWriter(Path(args.history))
    history.write("start", os_pid=os.getpid(), tid=args.tid)
    copier: Copier | None = None
    try:
        copier = Copier(args, history)
        return copier.run()
    except FENCED as exc:
        history.write("fenced", txn=copier.txn if copier else None, kind=type(exc).__name__)
        return EXIT_FENCED
    except Exception as exc:
        txn = copier.txn if copier else None
        history.write("error", txn=txn, kind=type(exc).__name__, message=str(exc)[:300])
        return EXIT_ERROR
    finally:
        if copier is not None:
            copier.consumer.close()
            with contextlib.suppress(Exception):  # a fenced producer may refuse to flush
                copier.producer.close(timeout=1.0)
        history.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
