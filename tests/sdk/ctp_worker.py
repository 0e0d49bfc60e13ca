"""A consume-transform-produce worker in plain Python, for the crash test.

Reads ``--input`` with read_committed from the group's committed offsets, writes
``out:<value>`` to ``--output`` (same key and partition) and commits the input offsets in
the same transaction. Killed with SIGKILL at random points and restarted; the restart's
``init_transactions`` fences the dead instance and aborts what it left open.
With ``--exit-when-idle`` it stops once a poll finds nothing more to read.
"""

from __future__ import annotations

import argparse
import sys
import time

from sdk import Consumer, TopicPartition, TransactionalProducer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--url", "--input", "--output", "--group", "--tid"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--exit-when-idle", action="store_true")
    parser.add_argument(
        "--pause-ms", type=int, default=0,
        help="wait this long after each transaction, so that a run spans several kills",
    )
    args = parser.parse_args(argv)

    producer = TransactionalProducer(args.url, args.tid, linger_ms=1)
    producer.init_transactions()
    consumer = Consumer(args.url, args.group, max_poll_records=15)
    assigned = [TopicPartition(args.input, p) for p in range(args.partitions)]
    consumer.assign(assigned)
    idle = 0
    while True:
        records = consumer.poll(timeout=0.3)
        if not records:
            idle += 1
            if args.exit_when_idle and idle >= 3:
                break
            continue
        idle = 0
        with producer.transaction():
            for record in records:
                producer.send(args.output, f"out:{record.value!s}", key=record.key,
                              partition=record.partition)
            positions = {tp: consumer.position(tp) for tp in assigned}
            producer.send_offsets_to_transaction(positions, args.group)
        time.sleep(args.pause_ms / 1000)
    producer.close()
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
