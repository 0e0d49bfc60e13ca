"""Structured Streaming through ``format("eos")``: copy throughput and micro-batch latency.

Two measurements, run by ``eos bench`` (part ``spark``) beside the batch pipeline's, in
the same ``local[2]`` session and on the same services:

* ``stream_copy``: EOS → ``readStream.format("eos")`` → ``writeStream.format("eos")`` → EOS,
  the source filled beforehand and read with ``Trigger.AvailableNow``, exactly once (one
  transaction per micro-batch, tasks writing in slots) or at-least-once (``mode``), input
  records/s from the first micro-batch's start to the query's end;
* ``stream_latency``: the same query with the default trigger (a micro-batch as soon as
  the last one ends) while a producer writes a steady rate into the source: for each record,
  the time from its source commit to the moment a read_committed consumer of the sink sees
  it (the value carries the commit time); p50 and p95.

The sink topic is new for every run; every run checks that the sink holds as many visible
records as the source gave, or fails (a fast run that loses records is no result).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

from sdk import AdminClient, Consumer, TopicPartition, TransactionalProducer
from spark_jobs.datasource import register

PARTITIONS = 2


def _sink(url: str) -> str:
    sink = f"stream-sink-{uuid.uuid4().hex[:8]}"
    with AdminClient(url) as admin:
        admin.create_topic(sink, PARTITIONS)
    return sink


def _visible(url: str, topic: str) -> int:
    """Records a read_committed consumer gets from ``topic`` (offsets would count the
    transaction markers too)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with AdminClient(url) as admin:
        ends = {tp: admin.list_offsets(tp).last_stable_offset for tp in tps}
    count = 0
    with Consumer(url, max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            count += len(consumer.poll(timeout=1.0))
    return count


def _query(spark: Any, url: str, source: str, sink: str, exactly_once: bool, **read: str) -> Any:
    events = (
        spark.readStream.format("eos").option("bootstrap", url).option("subscribe", source)
        .options(**read).load()
    )  # fmt: skip
    writer = (
        events.select("key", "value").writeStream.format("eos").option("bootstrap", url)
        .option("topic", sink)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="eos-bench-stream-ck-"))
    )  # fmt: skip
    if exactly_once:
        writer = writer.option("transactionalIdPrefix", f"bench-{uuid.uuid4().hex[:8]}")
    else:
        writer = writer.option("mode", "at_least_once")
    return writer


def stream_copy(spark: Any, url: str, source: str, records: int, exactly_once: bool) -> float:
    """Copy the whole ``source`` (``records`` records) in one AvailableNow run; records/s."""
    register(spark)
    sink = _sink(url)
    began = time.monotonic()
    query = (
        _query(spark, url, source, sink, exactly_once, startingOffsets="earliest")
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    seconds = time.monotonic() - began
    if query.exception() is not None:
        raise SystemExit(f"streaming copy failed: {query.exception()}")
    visible = _visible(url, sink)
    if visible != records:
        raise SystemExit(f"streaming copy: {records} in, {visible} visible")
    return records / seconds


def stream_latency(
    spark: Any, url: str, seconds: float = 20.0, rate: int = 2_000
) -> dict[str, float]:
    """Commit-to-visible latency of the default trigger under a steady ``rate`` (records/s
    in transactions of 100 ms); p50/p95 in seconds, and the records measured."""
    register(spark)
    source, sink = _sink(url), _sink(url)
    query = _query(spark, url, source, sink, True, startingOffsets="latest").start()
    stop = threading.Event()
    latencies: list[float] = []
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with TransactionalProducer(url, f"bench-lat-{uuid.uuid4().hex[:8]}") as producer:
                producer.init_transactions()
                i = 0
                while not stop.is_set():
                    producer.begin_transaction()
                    for _ in range(rate // 10):
                        producer.send(source, f"{i}", key=f"k{i}")
                        i += 1
                    producer.commit_transaction()
                    committed = time.time()
                    # the commit time, as the records' own: one marker record per transaction
                    producer.begin_transaction()
                    producer.send(source, f"t={committed}", key="clock")
                    producer.commit_transaction()
                    time.sleep(0.1)
        except BaseException as exc:
            failures.append(exc)

    # Wait until the query has made its first (empty) batch, so "latest" is settled.
    deadline = time.monotonic() + 120
    while not query.recentProgress and time.monotonic() < deadline:
        time.sleep(0.2)
    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    consumer = Consumer(url, isolation_level="read_committed")
    consumer.assign([TopicPartition(sink, p) for p in range(PARTITIONS)])
    for p in range(PARTITIONS):
        consumer.seek(TopicPartition(sink, p), 0)
    ends = time.monotonic() + seconds
    try:
        while time.monotonic() < ends or (not latencies and time.monotonic() < ends + 60):
            for record in consumer.poll(timeout=0.2):
                # the copy keeps the source's binary values: the sink holds bytes
                raw = record.value
                value = raw.decode() if isinstance(raw, bytes) else str(raw)
                if value.startswith("t="):
                    latencies.append(time.time() - float(value[2:]))
    finally:
        stop.set()
        writer.join(timeout=30)
        consumer.close()
        query.stop()
    if failures:
        raise failures[0]
    if not latencies:
        raise SystemExit("stream latency: no record reached the sink")
    ordered = sorted(latencies)
    return {
        "p50_s": round(statistics.median(ordered), 3),
        "p95_s": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "measured": len(ordered),
    }
