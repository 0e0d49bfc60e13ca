"""The sample pipeline: parse JSON events, enrich them, route them to two topics.

Input records are JSON objects such as
``{"event_id": "e-17", "user": "u3", "type": "purchase", "amount": 42.5}``. A well-formed
event is enriched (the user's country and tier from a lookup table, the amount band, the
source offset it came from) and goes to the ``enriched`` topic, keyed by user; anything
else (not JSON, a missing field, a negative amount) goes to the ``dead_letter`` topic with
the reason, so nothing is dropped silently. Both topics are written in the same
transaction as the source offsets.

It comes in both forms the job takes, which give the same output:

* ``record_transform`` (``eos spark run --transform spark_jobs.examples.events:record_transform``)
* ``dataframe_transform`` (the same with ``--dataframe``).

``make_events`` writes sample input (``eos spark sample-events``), with a few malformed
events mixed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sdk import ConsumerRecord, Producer
from spark_jobs.transforms import DataFrameTransform, OutputRecord, RecordTransform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

USERS: dict[str, tuple[str, str]] = {
    "u0": ("FR", "gold"),
    "u1": ("DE", "silver"),
    "u2": ("US", "bronze"),
    "u3": ("JP", "gold"),
    "u4": ("BR", "silver"),
}
UNKNOWN_USER = ("??", "none")
REQUIRED = ("event_id", "user", "type", "amount")


def amount_band(amount: float) -> str:
    if amount < 10:
        return "small"
    if amount < 100:
        return "medium"
    return "large"


def source_of(record: ConsumerRecord) -> str:
    """``topic-partition@offset``: where an output came from (the checker's identity)."""
    return f"{record.topic}-{record.partition}@{record.offset}"


def output_source(record: ConsumerRecord) -> str:
    """The ``source`` an output record of this pipeline carries."""
    value = record.value if isinstance(record.value, str) else (record.value or b"").decode()
    return str(json.loads(value)["source"])


def _problem(event: Any) -> str | None:
    if not isinstance(event, dict):
        return "not a JSON object"
    missing = [name for name in REQUIRED if name not in event]
    if missing:
        return f"missing {', '.join(missing)}"
    if not isinstance(event["amount"], int | float) or event["amount"] < 0:
        return "amount is not a non-negative number"
    return None


def enrich(record: ConsumerRecord, enriched: str, dead_letter: str) -> OutputRecord:
    """The one output record of an input record."""
    raw = record.value if isinstance(record.value, str) else (record.value or b"").decode()
    try:
        event: Any = json.loads(raw)
    except ValueError:
        event = None
    problem = "not JSON" if event is None else _problem(event)
    if problem is not None:
        body = {"reason": problem, "raw": raw, "source": source_of(record)}
        return OutputRecord(dead_letter, json.dumps(body, sort_keys=True), record.key)
    country, tier = USERS.get(str(event["user"]), UNKNOWN_USER)
    out = {
        **event,
        "country": country,
        "tier": tier,
        "amount_band": amount_band(float(event["amount"])),
        "source": source_of(record),
    }
    return OutputRecord(enriched, json.dumps(out, sort_keys=True), str(event["user"]))


def record_transform(
    enriched: str = "events-enriched", dead_letter: str = "events-dead-letter"
) -> RecordTransform:
    """The record-transform form (a factory: topics are options)."""

    def transform(record: ConsumerRecord) -> Iterable[OutputRecord]:
        return (enrich(record, enriched, dead_letter),)

    return transform


def dataframe_transform(
    enriched: str = "events-enriched", dead_letter: str = "events-dead-letter"
) -> DataFrameTransform:
    """The DataFrame form: ``from_json``, a join-free lookup, and a ``topic`` column."""

    def transform(df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        def one(value: str | None, topic: str, partition: int, offset: int) -> tuple[str, str]:
            record = ConsumerRecord(topic, partition, offset, None, value, {}, 0)
            out = enrich(record, enriched, dead_letter)
            return out.topic, str(out.value)

        result = StructType(
            [StructField("topic", StringType()), StructField("value", StringType())]
        )
        enrich_udf = F.udf(one, result, useArrow=False)
        made = df.select(
            enrich_udf("value", "topic", "partition", "offset").alias("out"), "key"
        )
        user = F.get_json_object(F.col("out.value"), "$.user")
        return made.select(
            F.col("out.topic").alias("topic"),
            F.when(F.col("out.topic") == enriched, user).otherwise(F.col("key")).alias("key"),
            F.col("out.value").alias("value"),
        )

    return transform


def sample_event(i: int) -> str:
    """Event ``i``; every 17th is malformed in one of three ways."""
    if i % 17 == 5:
        return f"not json {i}"
    if i % 17 == 11:
        return json.dumps({"event_id": f"e-{i}", "user": f"u{i % 5}"})
    if i % 17 == 13:
        return json.dumps({"event_id": f"e-{i}", "user": "u1", "type": "refund", "amount": -3})
    kinds = ("view", "click", "purchase")
    amount = round((i * 37) % 250 + 0.5, 2)
    body = {"event_id": f"e-{i}", "user": f"u{i % 7}", "type": kinds[i % 3], "amount": amount}
    return json.dumps(body, sort_keys=True)


def make_events(bootstrap_url: str, topic: str, count: int, start: int = 0) -> None:
    """Write events ``start .. start+count-1`` to ``topic`` (keyed by event number)."""
    with Producer(bootstrap_url, linger_ms=5, batch_size=256 * 1024) as producer:
        for i in range(start, start + count):
            producer.send(topic, sample_event(i), key=f"k{i}")
        producer.flush()
