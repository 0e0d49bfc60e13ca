"""The read_committed reader of the chaos workload: a process that reads the whole output
topic for the whole run and records every record it is given, with the time it had it.

It never goes back: if a poll fails past the SDK's own retries (a node down longer than
they last), it records the error, makes a new consumer and carries on from the positions
it had reached. Once the workload writes the stop file (partition -> end offset, written
after every copier has finished), it reads up to those ends and exits.

Run as ``python -m tests.chaos.reader --url U --topic T --partitions N --history H --stop S``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from sdk import Consumer, TopicPartition
from tests.chaos.history import HistoryWriter


def _consumer(url: str, positions: dict[TopicPartition, int]) -> Consumer:
    consumer = Consumer(url, None, max_poll_records=2000, fetch_max_wait_ms=200)
    consumer.assign(list(positions))
    for tp, offset in positions.items():
        consumer.seek(tp, offset)
    return consumer


def _ends(stop: Path) -> dict[int, int] | None:
    """The end offsets the workload wants read, once it has written them."""
    try:
        return {int(p): int(o) for p, o in json.loads(stop.read_text()).items()}
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--url", "--topic", "--history", "--stop"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    args = parser.parse_args(argv)
    history = HistoryWriter(Path(args.history))
    positions = {TopicPartition(args.topic, p): 0 for p in range(args.partitions)}
    consumer = _consumer(args.url, positions)
    try:
        while True:
            ends = _ends(Path(args.stop))
            if ends is not None and all(positions[tp] >= ends[tp.partition] for tp in positions):
                history.write("done", positions={tp.partition: o for tp, o in positions.items()})
                return 0
            try:
                records = consumer.poll(timeout=0.3)
            except Exception as exc:
                history.write("error", kind=type(exc).__name__, message=str(exc)[:300])
                with contextlib.suppress(Exception):
                    consumer.close()
                consumer = _consumer(args.url, positions)
                continue
            if records:
                rows = [[r.partition, r.offset, r.value] for r in records]
                history.write("poll", records=rows)
            for tp in positions:
                positions[tp] = consumer.position(tp)
    finally:
        consumer.close()
        history.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
