"""Reading a topic into Spark: offset ranges planned on the driver, read by the tasks.

The driver decides what a read covers before any task runs, so that every attempt of a
task reads the same records: for each partition of the topic an ``OffsetRange`` from the
group's committed offset (or the log start) up to the last stable offset the driver saw.
Below the LSO every transaction is decided, so a ``read_committed`` read of the range gives
the same records however often, and whenever, it is repeated.

There is one read path: a range is read by ``PartitionFetcher.fetch_range``.
``read_ranges`` and ``read_topic`` are ``spark.read.format("eos")`` with the ranges as its
``assign``, ``startingOffsets`` and ``endingOffsets`` (``spark_jobs.datasource``), shaped as
the pipeline's DataFrame transforms expect (``record_schema``: keys and values as text, a
record sent as bytes decoded as UTF-8 with replacement characters, so binary payloads
should be base64 text at the source). ``RangeReader`` is the same read for a pipeline task
that reads, transforms and writes in one transaction of its own, with a fetch ahead.
"""

from __future__ import annotations

import contextlib
import json
import operator
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdk import AdminClient, Consumer, ConsumerRecord, TopicPartition
from sdk._consumer_base import decode_payload
from spark_jobs._wire import STALL_TIMEOUT_S, PartitionFetcher

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: Fetches a ``RangeReader`` keeps ready ahead of its caller.
READ_AHEAD = 2

#: A text record's fields after topic and partition, in ``ConsumerRecord`` order.
_fields = operator.itemgetter("offset", "key", "value", "headers", "timestamp_ms")
#: Every record of a fetch answer names its encoding (``RecordOut.encoding``).
_encoding = operator.itemgetter("encoding")
_TEXT = frozenset({"utf8"})


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, planned on the driver."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def empty(self) -> bool:
        return self.start >= self.end


def plan_ranges(
    bootstrap_url: str,
    topic: str,
    *,
    group_id: str | None = None,
    max_records_per_partition: int | None = None,
    require_stable: bool = False,
) -> list[OffsetRange]:
    """One range per partition: from the group's committed offset (the log start if it has
    none, or if there is no group) to the partition's last stable offset, at most
    ``max_records_per_partition`` offsets long.

    ``require_stable=False`` by default: the plan is only a bound. A task that commits
    offsets re-reads the committed offset itself once its ``init_transactions`` has settled
    any transaction left open, so the driver need not wait for one to time out.
    """
    with AdminClient(bootstrap_url) as admin:
        count = len(admin.describe_topic(topic).partitions)
        tps = [TopicPartition(topic, p) for p in range(count)]
        ends = {tp: admin.list_offsets(tp) for tp in tps}
    committed: dict[TopicPartition, int] = {}
    if group_id is not None:
        with Consumer(bootstrap_url, group_id) as consumer:
            for tp, found in consumer.committed(tps, require_stable=require_stable).items():
                if found is not None:
                    committed[tp] = found.offset
    ranges = []
    for tp in tps:
        offsets = ends[tp]
        start = committed.get(tp, offsets.log_start_offset)
        end = offsets.last_stable_offset
        if max_records_per_partition is not None:
            end = min(end, start + max_records_per_partition)
        ranges.append(OffsetRange(topic, tp.partition, start, max(start, end)))
    return ranges


def iter_range(
    consumer: Consumer, tp: TopicPartition, start: int, end: int
) -> Iterator[ConsumerRecord]:
    """The records of ``tp`` at offsets ``[start, end)``, in order, through an SDK
    consumer (of any isolation level; the tasks use ``RangeReader`` instead).

    The consumer must be assigned ``tp``. Its position moves to the node's ``next_offset``
    after every fetch, past markers and aborted batches, so the loop ends once the position
    reaches ``end`` even when the last offsets of the range hold no record.
    """
    if start >= end:
        return
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    while consumer.position(tp) < end:
        before = consumer.position(tp)
        for record in consumer.poll(timeout=0.5):
            if record.offset < end:
                yield record
        if consumer.position(tp) > before:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
            raise TimeoutError(f"{tp.topic}-{tp.partition}: no progress at {before} (end {end})")


def records_of(topic: str, partition: int, raw: list[dict[str, Any]]) -> list[ConsumerRecord]:
    """A fetch answer's records, built in one pass. Text records (the usual case) need no
    per-record decoding, and are built without the named tuple's Python-level
    constructor: this runs for every record a task reads."""
    if set(map(_encoding, raw)) <= _TEXT:
        new = tuple.__new__
        return [
            new(ConsumerRecord, (topic, partition, *_fields(r)))
            for r in raw
        ]
    return [
        ConsumerRecord(
            topic, partition, r["offset"],
            decode_payload(r.get("key"), r.get("encoding", "utf8")),
            decode_payload(r.get("value"), r.get("encoding", "utf8")),
            r.get("headers") or {}, r["timestamp_ms"],
        )
        for r in raw
    ]


_Item = list[ConsumerRecord] | BaseException | None


class RangeReader:
    """Reads ``[start, end)`` of one partition read_committed, a fetch at a time, with a
    thread fetching ahead: the node prepares the next answer while the task transforms
    the last one. Iterate once; ``close`` always (it stops the thread).

    The read moves to each answer's ``next_offset`` (past markers and aborted batches),
    so it ends at ``end`` even when the last offsets of the range hold no record; records
    come in offset order, the same ones on every attempt (``end`` is below the LSO).
    """

    def __init__(
        self,
        bootstrap_url: str,
        tp: TopicPartition,
        start: int,
        end: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.tp, self.start, self.end = tp, start, end
        self.max_records, self.max_bytes = max_records, max_bytes
        self._fetcher = PartitionFetcher(bootstrap_url, None)
        self._ready: queue.Queue[_Item] = queue.Queue(maxsize=READ_AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fetch_loop, name="eos-range-reader")
        self._thread.daemon = True
        self._thread.start()

    def __iter__(self) -> Iterator[list[ConsumerRecord]]:
        while True:
            item = self._ready.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._ready.get(timeout=0.05)
        self._fetcher.close()

    def _fetch_loop(self) -> None:
        item: _Item = None
        try:
            self._read()
        except BaseException as exc:
            item = exc
        self._put(item)

    def _read(self) -> None:
        tp = self.tp
        for raw in self._fetcher.fetch_range(
            tp, self.start, self.end, max_records=self.max_records, max_bytes=self.max_bytes,
            stopped=self._stop.is_set,
        ):
            if not self._put(records_of(tp.topic, tp.partition, raw)):
                return

    def _put(self, item: _Item) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def read_range(
    bootstrap_url: str, tp: TopicPartition, start: int, end: int, **limits: int
) -> Iterator[list[ConsumerRecord]]:
    """``RangeReader`` as a generator that closes it."""
    reader = RangeReader(bootstrap_url, tp, start, end, **limits)
    try:
        yield from reader
    finally:
        reader.close()


def record_schema() -> StructType:
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    return StructType(
        [
            StructField("topic", StringType(), False),
            StructField("partition", IntegerType(), False),
            StructField("offset", LongType(), False),
            StructField("key", StringType(), True),
            StructField("value", StringType(), True),
            StructField("timestamp_ms", LongType(), False),
            StructField("headers", MapType(StringType(), StringType()), True),
        ]
    )


def ranges_options(ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """The ``format("eos")`` options that read exactly ``ranges``: every range's partition
    assigned, started at its start and ended at its end."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    return {
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
    }


def as_records(df: DataFrame) -> DataFrame:
    """A ``format("eos")`` DataFrame (Kafka's columns) with the columns of
    ``record_schema``: keys and values as text, the timestamp in milliseconds, headers a
    map of text (None without headers)."""
    from pyspark.sql import functions as F

    headers = F.when(
        F.size("headers") > 0,
        F.map_from_entries(
            F.transform("headers", lambda h: F.struct(h["key"], h["value"].cast("string")))
        ),
    )
    return df.select(
        "topic", "partition", "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        F.unix_millis("timestamp").alias("timestamp_ms"),
        headers.alias("headers"),
    )  # fmt: skip


def read_ranges(
    spark: SparkSession,
    bootstrap_url: str,
    ranges: Sequence[OffsetRange],
    *,
    max_poll_records: int = 10_000,
) -> DataFrame:
    """A DataFrame of the records of ``ranges`` (read_committed): ``spark.read.format("eos")``
    over exactly those offsets, a Spark partition per range (more for a range of over a
    million offsets); columns ``topic, partition, offset, key, value, timestamp_ms,
    headers``."""
    from spark_jobs.datasource import register

    wanted = [r for r in ranges if not r.empty]
    if not wanted:
        return spark.createDataFrame([], record_schema())
    register(spark)
    df = (
        spark.read.format("eos")
        .option("bootstrap", bootstrap_url)
        .option("fetchMaxRecords", str(max_poll_records))
        .options(**ranges_options(wanted))
        .load()
    )
    return as_records(df)


def read_topic(
    spark: SparkSession,
    bootstrap_url: str,
    topic: str,
    *,
    group_id: str | None = None,
    max_records_per_partition: int | None = None,
) -> DataFrame:
    """The topic's committed records from the group's offsets (or the start) up to its
    last stable offset now: ``read_ranges(plan_ranges(...))``."""
    ranges = plan_ranges(
        bootstrap_url, topic, group_id=group_id,
        max_records_per_partition=max_records_per_partition,
    )
    return read_ranges(spark, bootstrap_url, ranges)
