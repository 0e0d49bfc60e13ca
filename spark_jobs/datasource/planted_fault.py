"""A fault planted in a sink task on purpose: ``eos demo`` shows with it that a task which
fails half way through its write, and is retried by Spark, leaves no second copy.

``EOS_SPARK_FAIL_TASK_ONCE=<witness file>:<records>`` makes the first attempt of the task of
Spark partition 0 fail once it has written at least ``<records>`` records (whole batches,
acknowledged by the storage node, so they really sit in the open transaction). It touches
the witness file first, so the driver can tell the fault fired; the witness also makes the
fault fire once per run, whatever Spark retries. Executors read the variable from their
own environment: in local mode the driver's. Unset, nothing happens.

The retry writes the same batches in the same slot with the same sequences, which the node
answers as duplicates, and goes on from there (``task_write``).
"""

from __future__ import annotations

import os
from pathlib import Path

FAIL_TASK_ONCE_ENV = "EOS_SPARK_FAIL_TASK_ONCE"


class PlantedTaskFault(RuntimeError):
    """The planted failure (a task that dies mid-write)."""


def _armed() -> tuple[Path, int] | None:
    setting = os.environ.get(FAIL_TASK_ONCE_ENV, "")
    if not setting:
        return None
    witness, _, records = setting.rpartition(":")
    if not witness or not records.isdigit():
        raise ValueError(f"{FAIL_TASK_ONCE_ENV}={setting!r}: expected <witness file>:<records>")
    return Path(witness), int(records)


def after_written(records: int) -> None:
    """Called by a sink task after each acknowledged batch, with its records written so
    far: raises ``PlantedTaskFault`` at the planted point, else returns."""
    armed = _armed()
    if armed is None:
        return
    witness, after = armed
    if records < after or witness.exists():
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or context.partitionId() != 0 or context.attemptNumber() != 0:
        return
    witness.touch()
    raise PlantedTaskFault(
        f"planted fault: the first attempt of task 0 fails after writing {records} records"
    )
