"""A service with a bug planted in it, to show the checker catches what each bug breaks.

    python -m tests.jepsen.planted <service flags...> --planted-bug BUG

The wrapper takes ``--planted-bug`` off its arguments, patches one function of the service
and runs the service's own entry point with the rest, in this process (a service is one
process under uvicorn, so the patch holds for all it does). The bugs are the ones a
Jepsen-style checker exists to catch:

* ``ack-before-isr`` (a storage node): acks=all answered once the leader has the batch,
  without waiting for the in-sync replicas; a leader cut from its followers and killed
  before they leave its ISR (``leader-crash``) loses what it acknowledged alone when one
  of them is elected (``lost``).
* ``hw-reader`` (a storage node): read_committed bound by the high watermark instead of
  the last stable offset, aborted records not left out; a reader sees undecided and
  aborted records (``undecided-read``, ``aborted-read``).
* ``one-marker`` (a coordinator): a decision's marker written to the first of its
  partitions only; the others never learn the outcome (``partial``, ``lost``).
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

FLAG = "--planted-bug"
SERVICE = {
    "ack-before-isr": "partition_service",
    "hw-reader": "partition_service",
    "one-marker": "coordinator_service",
}


def _ack_before_isr() -> None:
    from partition_service.partition import Partition

    async def no_wait(self: Any, end: int, leader_epoch: int | None) -> None:
        return None

    Partition._wait_in_sync = no_wait  # type: ignore[method-assign]


def _hw_reader() -> None:
    from partition_service.log.engine import PartitionEngine

    original = PartitionEngine.read

    def read(self: Any, offset: int, **kwargs: Any) -> Any:
        kwargs["read_committed"] = False
        return original(self, offset, **kwargs)

    PartitionEngine.read = read  # type: ignore[method-assign]


def _one_marker() -> None:
    from coordinator_service.transactions.markers import MarkerChannel

    original = MarkerChannel.submit

    def submit(self: Any, job: Any) -> Any:
        pending = {node: parts for node, parts in job.pending.items() if parts}
        if pending:
            node = min(pending)
            job.pending = {node: {min(pending[node])}}
        return original(self, job)

    MarkerChannel.submit = submit  # type: ignore[method-assign]


PATCHES = {"ack-before-isr": _ack_before_isr, "hw-reader": _hw_reader, "one-marker": _one_marker}


def main() -> None:
    argv = sys.argv[1:]
    if FLAG not in argv:
        raise SystemExit(f"usage: python -m tests.jepsen.planted <flags> {FLAG} BUG")
    at = argv.index(FLAG)
    bug = argv[at + 1]
    if bug not in PATCHES:
        raise SystemExit(f"unknown bug {bug!r}: one of {sorted(PATCHES)}")
    PATCHES[bug]()
    sys.argv = [SERVICE[bug], *argv[:at], *argv[at + 2 :]]
    runpy.run_module(SERVICE[bug], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
