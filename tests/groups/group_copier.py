"""One copy of a consume-transform-produce application in a consumer group: an OS process,
so SIGKILL and SIGSTOP are real. Run as ``python -m tests.groups.group_copier ...``.

It subscribes to the input topic in the group and copies every record it polls to the same
partition of the output topic (same key, same value), with the polled partitions' next
offsets in the same transaction, committed with the member's ``group_metadata()``: the
coordinator refuses the offsets of a member that no longer owns its partitions (KIP-447).

Everything the copy believes goes to its log (JSON lines, flushed each time) with the wall
time, so the test can check ownership from the members' own accounts: ``member`` (its id),
``assigned`` / ``revoked`` / ``lost`` (partitions), ``commit`` (the partitions and offsets
committed), ``refused`` (an abortable error and its code), ``pausing`` (see below).

A test makes a zombie by creating the file ``--pause-file``: at its next transaction, after
sending the records and before sending the offsets, the copy logs ``pausing`` and stops
itself with SIGSTOP; the test lets its session run out and resumes it with SIGCONT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from sdk import (
    AbortableError,
    Consumer,
    ConsumerRecord,
    TopicPartition,
    TransactionalProducer,
)


class Log:
    def __init__(self, path: Path) -> None:
        self._out: TextIO = path.open("a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        self._out.write(json.dumps({"t": time.time(), "event": event, **fields}) + "\n")
        self._out.flush()


def _names(partitions: set[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)


class GroupCopier:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = Log(Path(args.log))
        self.pause_file = Path(args.pause_file)
        self.producer = TransactionalProducer(
            args.url, args.tid, transaction_timeout_ms=args.txn_timeout_ms, linger_ms=2,
        )
        self.consumer = Consumer(args.url, args.group, max_poll_records=50,
                                 fetch_max_wait_ms=100)
        self.stopping = False

    def run(self) -> None:
        self.producer.init_transactions()
        self.consumer.subscribe(
            [self.args.input],
            on_assigned=lambda tps: self.log.write("assigned", partitions=_names(tps)),
            on_revoked=lambda tps: self.log.write("revoked", partitions=_names(tps)),
            on_lost=lambda tps: self.log.write("lost", partitions=_names(tps)),
        )
        member = None
        while not self.stopping:
            records = self.consumer.poll(timeout=0.5)
            meta = self.consumer.group_metadata()
            if meta.member_id != member:
                member = meta.member_id
                self.log.write("member", member_id=member)
            if records:
                self._copy(records)

    def _copy(self, records: list[ConsumerRecord]) -> None:
        offsets: dict[TopicPartition, int] = {}
        self.producer.begin_transaction()
        try:
            for record in records:
                self.producer.send(self.args.output, record.value, key=record.key,
                                   partition=record.partition)
                offsets[TopicPartition(record.topic, record.partition)] = record.offset + 1
            if self.pause_file.exists():
                self.pause_file.unlink()
                self.producer.flush()
                self.log.write("pausing", partitions=sorted(tp.partition for tp in offsets))
                os.kill(os.getpid(), signal.SIGSTOP)
                self.log.write("resumed")
            self.producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata())
            self.producer.commit_transaction()
            self.log.write("commit", offsets={str(tp.partition): o for tp, o in offsets.items()})
        except AbortableError as exc:
            self.log.write("refused", code=exc.code, message=str(exc)[:300])
            self.producer.abort_transaction()
            self._rewind(set(offsets))

    def _rewind(self, partitions: set[TopicPartition]) -> None:
        """Read the aborted records again, from the committed offsets of the partitions
        still owned (those lost are read by their new owner from there)."""
        owned = partitions & self.consumer.assignment()
        if not owned:
            return
        committed = self.consumer.committed(owned)
        for tp in owned:
            found = committed.get(tp)
            self.consumer.seek(tp, found.offset if found is not None else 0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--url", "--group", "--input", "--output", "--tid", "--log", "--pause-file"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--txn-timeout-ms", type=int, default=20_000)
    args = parser.parse_args(argv)
    copier = GroupCopier(args)

    def stop(_signum: int, _frame: object) -> None:
        copier.stopping = True

    signal.signal(signal.SIGTERM, stop)
    copier.log.write("start", pid=os.getpid())
    try:
        copier.run()
    finally:
        copier.consumer.close()  # leaves the group
        copier.producer.close(timeout=5.0)
        copier.log.write("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
