"""``spark.read.format("eos")``: ranges planned on the driver, read by the tasks.

The driver (``EosBatchReader.partitions``) turns the options into one ``Slice`` per
partition, from ``startingOffsets`` (default earliest) to ``endingOffsets`` (default: the
last stable offset now, so only decided transactions are read), cut into several tasks
when long. Filters Spark pushes down narrow the plan before any task exists:

* ``topic`` and ``partition`` equal to / in a set: partitions left out of the plan;
* ``offset`` compared with a constant (=, <, <=, >, >=): each range cut to the bounds;
* ``timestamp``: EOS has no offsets-for-times index, so the task drops records outside
  the bounds but Spark is told the filter was not pushed, and checks it again.

A task reads its slice with read_committed fetches (``read_slice``) and moves to each
answer's ``next_offset``, past aborted batches and markers, so it stops at the planned
end even when the last offsets hold no visible record: the same rows on every attempt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from sdk import TopicPartition
from spark_jobs._wire import PartitionFetcher
from spark_jobs.datasource import planning
from spark_jobs.datasource.options import Connection, SourceOptions
from spark_jobs.datasource.planning import Pushed, Slice
from spark_jobs.datasource.records import arrow_rows


class SliceInput(InputPartition):
    """One task's slice, with what the task needs to read it."""

    def __init__(self, piece: Slice) -> None:
        super().__init__(piece)
        self.piece = piece


def read_slice(
    connection: Connection,
    piece: Slice,
    *,
    read_committed: bool = True,
    max_records: int = 10_000,
    pushed: Pushed | None = None,
) -> Iterator[Any]:
    """The rows of ``piece`` in offset order (the body of a read task), as Arrow record
    batches, one per fetch (``PartitionFetcher.fetch_range``)."""
    fetcher = connection.secure(PartitionFetcher(connection.bootstrap, None))
    tp = TopicPartition(piece.topic, piece.partition)
    low = None if pushed is None else pushed.min_timestamp_ms
    high = None if pushed is None else pushed.max_timestamp_ms
    try:
        for records in fetcher.fetch_range(
            tp, piece.start, piece.end, max_records=max_records, read_committed=read_committed
        ):
            if low is not None or high is not None:
                records = [
                    r for r in records
                    if (low is None or r["timestamp_ms"] >= low)
                    and (high is None or r["timestamp_ms"] <= high)
                ]  # fmt: skip
            if records:  # one Arrow batch per fetch
                yield arrow_rows(piece.topic, piece.partition, records)
    finally:
        fetcher.close()


def _column(f: Filter) -> str:
    attribute = getattr(f, "attribute", ())
    return ".".join(attribute).lower() if len(attribute) == 1 else ""


def _ms(value: Any) -> int | None:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else None


def push(pushed: Pushed, filters: Sequence[Filter]) -> list[Filter]:
    """Record what ``filters`` allow in ``pushed``; returns those Spark must still apply
    (every returned filter is one of ``filters``, as ``pushFilters`` requires)."""
    left: list[Filter] = []
    for f in filters:
        column = _column(f)
        value = getattr(f, "value", None)
        if column in ("topic", "partition") and isinstance(f, EqualTo | In):
            values: list[Any] = list(f.value) if isinstance(f, In) else [value]
            if column == "topic":
                names = {v for v in values if isinstance(v, str)}
                pushed.topics = names if pushed.topics is None else pushed.topics & names
            else:
                ints = {v for v in values if isinstance(v, int)}
                pushed.partitions = ints if pushed.partitions is None else pushed.partitions & ints
            pushed.notes.append(f"{column} in {values}")
        elif column == "offset" and isinstance(value, int) and isinstance(
            f, EqualTo | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual
        ):
            low = {EqualTo: value, GreaterThan: value + 1, GreaterThanOrEqual: value}
            high = {EqualTo: value + 1, LessThan: value, LessThanOrEqual: value + 1}
            if type(f) in low:
                pushed.min_offset = max(pushed.min_offset, low[type(f)])
            if type(f) in high:
                bound = high[type(f)]
                pushed.max_offset = bound if pushed.max_offset is None else min(
                    pushed.max_offset, bound
                )
            pushed.notes.append(f"offset {type(f).__name__} {value}")
        elif column == "timestamp" and _ms(value) is not None:
            ms = _ms(value)
            assert ms is not None
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                pushed.min_timestamp_ms = max(pushed.min_timestamp_ms or 0, ms)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                top = ms if pushed.max_timestamp_ms is None else min(pushed.max_timestamp_ms, ms)
                pushed.max_timestamp_ms = top
            left.append(f)  # filtered in the task too, but Spark must check it
        else:
            left.append(f)
    return left


def plan(options: SourceOptions, pushed: Pushed) -> list[Slice]:
    """The batch read's slices: start and end per partition, narrowed by ``pushed``."""
    names = [t for t in planning.topics(options) if pushed.topics is None or t in pushed.topics]
    slices = []
    for tp, at in sorted(planning.bounds(options, names).items()):
        if not pushed.keep(tp.topic, tp.partition):
            continue
        start = planning.resolve(options.starting, "earliest", tp, at)
        end = min(planning.resolve(options.ending, "latest", tp, at), at.end)
        start = planning.check_lost(options, tp, start, at)
        start = max(start, pushed.min_offset)
        if pushed.max_offset is not None:
            end = min(end, pushed.max_offset)
        slices.append(Slice(tp.topic, tp.partition, start, max(start, end)))
    return planning.split(slices, options.max_offsets_per_task, options.min_partitions)


class EosBatchReader(DataSourceReader):
    """The batch reader: ``pushFilters`` and ``partitions`` run on the driver, ``read`` in
    the tasks (this object is pickled to them with what the driver decided)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Filter]) -> Any:
        return push(self.pushed, filters)

    def partitions(self) -> Sequence[InputPartition]:
        return [SliceInput(s) for s in plan(self.options, self.pushed)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SliceInput)
        return read_slice(
            self.options.connection, partition.piece,
            read_committed=self.options.read_committed,
            max_records=self.options.fetch_max_records, pushed=self.pushed,
        )

