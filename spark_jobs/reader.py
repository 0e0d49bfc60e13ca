"""Reading a topic into Spark: offset ranges planned on the driver, read by the tasks.

The driver decides what a read covers before any task runs, so that every attempt of a
task reads the same records: for each partition of the topic an ``OffsetRange`` from the
group's committed offset (or the log start) up to the last stable offset the driver saw.
Below the LSO every transaction is decided, so a ``read_committed`` read of the range gives
the same records however often, and whenever, it is repeated. One Spark partition reads one
topic partition.

Keys and values are text in the DataFrame; a record sent as bytes is decoded as UTF-8 with
replacement characters, so binary payloads should be base64 text at the source.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdk import AdminClient, Consumer, ConsumerRecord, TopicPartition
from sdk._types import Payload

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: A read that makes no progress for this long fails (the partition's node is gone).
STALL_TIMEOUT_S = 60.0


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
    """The read_committed records of ``tp`` at offsets ``[start, end)``, in order.

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


def text(payload: Payload | None) -> str | None:
    """A key or value as DataFrame text."""
    if payload is None or isinstance(payload, str):
        return payload
    return payload.decode("utf-8", errors="replace")


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


def _read_task(
    bootstrap_url: str, max_poll_records: int
) -> Any:
    def read(ranges: Iterable[OffsetRange]) -> Iterator[tuple[Any, ...]]:
        with Consumer(bootstrap_url, max_poll_records=max_poll_records) as consumer:
            for r in ranges:
                consumer.assign([r.tp])
                for rec in iter_range(consumer, r.tp, r.start, r.end):
                    yield (
                        rec.topic, rec.partition, rec.offset, text(rec.key), text(rec.value),
                        rec.timestamp_ms, rec.headers or None,
                    )

    return read


def read_ranges(
    spark: SparkSession,
    bootstrap_url: str,
    ranges: Sequence[OffsetRange],
    *,
    max_poll_records: int = 2000,
) -> DataFrame:
    """A DataFrame of the records of ``ranges`` (read_committed), one Spark partition per
    range; columns ``topic, partition, offset, key, value, timestamp_ms, headers``."""
    wanted = list(ranges)
    rdd = spark.sparkContext.parallelize(wanted, max(1, len(wanted)))
    rows = rdd.mapPartitions(_read_task(bootstrap_url, max_poll_records))
    return spark.createDataFrame(rows, record_schema())


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
