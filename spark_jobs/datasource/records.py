"""Rows of ``format("eos")``: the Kafka source's columns on read, the Kafka sink's on write.

A Spark user moving from ``format("kafka")`` keeps their code: a read gives ``key`` and
``value`` as binary (``CAST(value AS STRING)`` as with Kafka), ``topic``, ``partition``,
``offset``, ``timestamp``, ``timestampType`` and ``headers`` as an array of (string key,
binary value) pairs. EOS carries keys and values as text, or as base64 for bytes (the
batch's ``encoding``); both come back as the bytes the producer sent. Header values are
text on the wire, so they come back as their UTF-8 bytes, and a header value written must
be UTF-8. EOS records carry the producer's (or the node's) time in ``timestamp_ms``; the
type is reported as Kafka's CreateTime (0).

A write takes ``value`` (string or binary, required) and optional ``key``, ``topic``,
``partition`` and ``headers`` (Kafka's array of structs, or a map of strings). A record
without ``partition`` goes where the SDK puts a keyed record (murmur2 of the key); a
keyless one to murmur2 of its value, so that its place does not depend on which attempt
of a task wrote it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eos_protocol.partitioning import keyed_partition
from spark_jobs.datasource.options import EosOptionError

#: Kafka's timestampType for a producer-set time.
CREATE_TIME = 0

READ_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>"
)

WRITE_COLUMNS = frozenset({"key", "value", "topic", "partition", "headers"})


def read_schema() -> Any:
    """``READ_SCHEMA_DDL`` as a ``StructType`` (built without a JVM)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def _payload(text: str | None, binary: bool) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text) if binary else text.encode("utf-8")


def arrow_rows(topic: str, partition: int, records: Sequence[Mapping[str, Any]]) -> Any:
    """Fetched records (the node's JSON) as one Arrow ``RecordBatch`` of ``read_schema()``:
    a read task hands Spark whole batches instead of a tuple per record, which PySpark
    would otherwise check and convert one field at a time."""
    import pyarrow as pa

    schema = _arrow_read_schema()
    keys, values, offsets, times, headers = [], [], [], [], []
    for record in records:
        binary = record.get("encoding", "utf8") == "base64"
        keys.append(_payload(record.get("key"), binary))
        values.append(_payload(record.get("value"), binary))
        offsets.append(int(record["offset"]))
        times.append(int(record["timestamp_ms"]) * 1000)
        pairs = record.get("headers")
        headers.append(
            [{"key": k, "value": v.encode("utf-8")} for k, v in pairs.items()] if pairs else None
        )
    count = len(offsets)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(times, schema.field("timestamp").type),
        pa.array([CREATE_TIME] * count, pa.int32()),
        pa.array(headers, schema.field("headers").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


_ARROW_READ_SCHEMA: Any = None


def _arrow_read_schema() -> Any:
    """``read_schema()`` in Arrow, as PySpark converts it for a Python source (UTC)."""
    global _ARROW_READ_SCHEMA
    if _ARROW_READ_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_READ_SCHEMA = to_arrow_schema(read_schema(), timezone="UTC")
    return _ARROW_READ_SCHEMA


def check_write_schema(schema: Any, default_topic: str | None) -> bool:
    """Refuse, on the driver, a DataFrame the sink cannot write; returns whether keys and
    values travel as base64 (a binary ``key`` or ``value`` column)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructType,
    )

    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise EosOptionError(
            f"the DataFrame written to eos needs a 'value' column (string or binary); "
            f"it has {', '.join(schema.fieldNames()) or 'no columns'}"
        )
    text_or_bytes = (StringType, BinaryType)
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], text_or_bytes):
            raise EosOptionError(f"column {name} must be string or binary, not {fields[name]}")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise EosOptionError("column topic must be a string")
    if "topic" not in fields and default_topic is None:
        raise EosOptionError("give the option topic or a 'topic' column")
    if "partition" in fields and not isinstance(
        fields["partition"], IntegerType | LongType | ShortType
    ):
        raise EosOptionError("column partition must be an integer")
    if "headers" in fields:
        kind = fields["headers"]
        pairs = isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType) and [
            f.name for f in kind.elementType.fields
        ] == ["key", "value"]
        strings = isinstance(kind, MapType) and isinstance(kind.keyType, StringType)
        if not (pairs or strings):
            raise EosOptionError(
                "column headers must be array<struct<key: string, value: binary>> (Kafka's) "
                "or map<string, string>"
            )
    return any(isinstance(fields.get(n), BinaryType) for n in ("key", "value"))


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return bytes(value).decode("utf-8")


def _wire_payload(value: Any, binary: bool) -> str | None:
    if value is None:
        return None
    if not binary:
        return str(value)
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return base64.b64encode(raw).decode("ascii")


def _wire_headers(headers: Any) -> dict[str, str] | None:
    if not headers:
        return None
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for item in items:
        # Kafka's array<struct<key, value>>: Row or (from Arrow) dict elements; a map: pairs
        pair = (item["key"], item["value"]) if isinstance(item, Mapping) else item
        key, value = pair[0], pair[1]
        text = _text(value)
        out[str(key)] = "" if text is None else text
    return out


def row_fields(row: Any) -> Mapping[str, Any]:
    """A row's columns by name: an Arrow batch's rows are dicts already (``to_pylist``);
    a ``Row`` is asked once."""
    return row if isinstance(row, dict) else row.asDict()


def wire_record(fields: Mapping[str, Any], binary: bool) -> dict[str, Any]:
    """A row (its ``row_fields``) as the wire's ``RecordIn`` (keys and values base64 when
    ``binary``)."""
    record: dict[str, Any] = {
        "key": _wire_payload(fields.get("key"), binary),
        "value": _wire_payload(fields.get("value"), binary),
    }
    headers = _wire_headers(fields.get("headers"))
    if headers:
        record["headers"] = headers
    return record


def target_of(
    fields: Mapping[str, Any], default_topic: str | None, counts: Mapping[str, int]
) -> tuple[str, int]:
    """The topic and partition a row (its ``row_fields``) goes to: its columns, else the
    placement rule."""
    topic = fields.get("topic") or default_topic
    if topic is None:
        raise ValueError("a row has no topic and the option topic is not set")
    partition = fields.get("partition")
    if partition is None:
        basis = fields.get("key") if fields.get("key") is not None else fields.get("value")
        raw = basis if isinstance(basis, str) else bytes(basis or b"")
        partition = keyed_partition(raw, counts[topic])
    if not 0 <= int(partition) < counts[topic]:
        raise ValueError(f"{topic} has no partition {partition}")
    return str(topic), int(partition)


def sort_key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """The order a task writes a target partition's records in when it sorts them: by
    content, so every attempt of the task cuts the same batches."""
    headers = record.get("headers")
    return (
        record.get("key") or "",
        record.get("value") or "",
        "" if not headers else repr(sorted(headers.items())),
    )
