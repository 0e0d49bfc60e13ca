"""``spark.readStream.format("eos")``: micro-batches of offsets, each bounded by the LSO.

Spark keeps this source's offsets in its checkpoint as ``{"topic": {"partition": offset}}``
(the next offset to read, per partition). For each micro-batch Spark asks the driver for
an end (``latestOffset(start, limit)``), writes it to its offset log, then plans the tasks
(``partitions(start, end)``); on a restart it plans the logged batch again, from the same
offsets, so the ends must be ones whose records never change: every end is at most the
partition's last stable offset, below which every transaction is decided. A micro-batch
never includes a transaction that could still abort, and never waits for one either: an
open transaction only holds its partition's end back.

Admission control: ``maxRecordsPerTrigger`` (Spark's ``ReadMaxRows``) is shared among the
partitions in proportion to what each has waiting, as Kafka's source does;
``maxBytesPerTrigger`` (``ReadMaxBytes``) is turned into records with the mean record size
of a small sample fetch at each partition's position (an estimate: EOS has no per-offset
size index). ``Trigger.AvailableNow`` reads up to the ends seen when the query starts, in
as many batches as the limits make.

Partitions added to a topic, and new topics matching ``subscribePattern``, are read from
their log start at the next micro-batch. Offsets that retention removed before they were
read fail the query (``failOnDataLoss=true``, the default, naming the partition and the
offsets) or are skipped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sdk import TopicPartition
from spark_jobs.datasource import planning
from spark_jobs.datasource.batch_read import SliceInput, read_slice
from spark_jobs.datasource.options import SourceOptions
from spark_jobs.datasource.planning import Bounds, OffsetMap, Slice

log = logging.getLogger(__name__)

#: Records fetched to estimate a partition's record size for ``maxBytesPerTrigger``.
SIZE_SAMPLE = 50


def share(available: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """``limit`` records split among partitions in proportion to what each has waiting
    (never more than it has; what rounding leaves goes to the largest)."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    given = {tp: (n * limit) // total for tp, n in available.items()}
    left = limit - sum(given.values())
    for tp in sorted(available, key=lambda t: available[t] - given[t], reverse=True):
        if left <= 0:
            break
        if given[tp] < available[tp]:
            given[tp] += 1
            left -= 1
    return given


class EosStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader. The offset methods run on the driver; ``read`` in tasks."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: dict[TopicPartition, int] | None = None  # AvailableNow's ends
        self.running: set[str] = set()  # the topics read so far (``_now``)

    # --- driver --------------------------------------------------------------------------

    def _now(self, start: Mapping[str, Any] | None = None) -> dict[TopicPartition, Bounds]:
        """Every partition's bounds now. The topics the query has read (``start``, the last
        batch's offsets, and what this reader saw before) are remembered: one of them
        deleted is data lost (``planning.deleted``), not a wrong option."""
        self.running |= set(start or ())
        names = planning.topics(self.options, self.running)
        now = planning.bounds(self.options, names, self.running)
        self.running |= {tp.topic for tp in now}
        return now

    def initialOffset(self) -> dict[str, Any]:
        now = self._now()
        starting = self.options.starting
        return planning.to_offsets(
            {tp: planning.resolve(starting, "latest", tp, at) for tp, at in now.items()}
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: at.end for tp, at in self._now().items()}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return planning.to_offsets({tp: at.end for tp, at in self._now().items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        now = self._now(start)
        positions = planning.from_offsets(start)
        ends: dict[TopicPartition, int] = {}
        for tp, at in now.items():
            position = positions.get(tp)
            if position is None:  # a new partition, or a new topic of the pattern
                position = at.start
            position = planning.check_lost(self.options, tp, position, at)
            end = at.end
            if self.target is not None:
                end = min(end, self.target.get(tp, position))
            ends[tp] = max(position, end)
            positions[tp] = position
        available = {tp: ends[tp] - positions[tp] for tp in ends if ends[tp] > positions[tp]}
        allowed: dict[TopicPartition, int] | None = None
        if isinstance(limit, ReadMaxRows):
            allowed = share(available, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            allowed = share(available, self._records_for_bytes(positions, available, limit))
        if allowed is not None:
            for tp in available:
                ends[tp] = positions[tp] + allowed.get(tp, 0)
        for tp, offset in positions.items():
            ends.setdefault(tp, offset)  # a partition gone (topic deleted) keeps its offset
        return planning.to_offsets(ends)

    def _records_for_bytes(
        self,
        positions: Mapping[TopicPartition, int],
        available: Mapping[TopicPartition, int],
        limit: ReadMaxBytes,
    ) -> int:
        sizes = []
        for tp in available:
            end = positions[tp] + min(SIZE_SAMPLE, available[tp])  # never past the LSO
            piece = Slice(tp.topic, tp.partition, positions[tp], end)
            for batch in read_slice(self.options.connection, piece, max_records=SIZE_SAMPLE):
                pairs = zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                            strict=True)  # fmt: skip
                sizes += [len(k or b"") + len(v or b"") + 64 for k, v in pairs]
        mean = sum(sizes) / len(sizes) if sizes else 1024
        return max(1, int(limit.max_bytes // mean))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = planning.from_offsets(start)
        finish = planning.from_offsets(end)
        slices = []
        for tp, stop in sorted(finish.items()):
            first = begin.get(tp)
            if first is None:  # new since ``start``: from its log start, as planned
                with self.options.connection.admin() as admin:
                    first = admin.list_offsets(tp).log_start_offset
            if stop > first:
                slices.append(Slice(tp.topic, tp.partition, first, stop))
        slices = planning.split(slices, self.options.max_offsets_per_task, None)
        return [SliceInput(s) for s in slices]

    def commit(self, end: dict[str, Any]) -> None:
        """Spark's checkpoint holds the offsets; nothing is kept at the cluster."""

    # --- tasks ---------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SliceInput)
        return read_slice(
            self.options.connection, partition.piece,
            read_committed=self.options.read_committed,
            max_records=self.options.fetch_max_records,
        )


def offsets_of(batch: OffsetMap) -> dict[TopicPartition, int]:
    """A checkpointed offset map as partitions and offsets (for tests and tools)."""
    return planning.from_offsets(batch)
