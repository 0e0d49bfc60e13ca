"""Wire models of the multi-partition fetch, ``POST /v1/fetch`` (docs/design.md §4).

A consumer assigned many partitions used to send one long poll per partition: most of a
node's CPU then went to the HTTP work of requests that found nothing. Kafka's consumer
sends one Fetch to each broker for every partition it reads there, and so does this: one
request names each partition at the consumer's own position, the node answers them all
at once, and the per-request work is paid once per node instead of once per partition.

Each partition is answered on its own: one the node does not have, does not lead, may not
be read by the caller, or asked past its log carries its error beside the others'
records and never fails them. The wait follows Kafka's rule: the answer leaves at once
when a partition has an error or enough bytes are there (``min_bytes``), else when they
come or ``max_wait_ms`` has passed. The per-partition ``GET .../records`` stays served.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from eos_protocol.common import (
    AnswerModel,
    ErrorBody,
    Offset,
    PartitionIndex,
    TopicName,
    WireModel,
    examples,
)
from eos_protocol.node import FetchedRecord, IsolationLevel

#: Partitions in one request: a consumer's partitions on one node, bounded so that one
#: request's work (and its answer) stays within what a node does in one go.
MAX_FETCH_PARTITIONS = 10_000
#: The largest byte limit a request may set, in all or for one partition (as the
#: per-partition fetch's ``max_bytes``).
MAX_FETCH_BYTES = 64 * 1024 * 1024
#: Kafka's ``fetch.max.bytes`` and ``max.partition.fetch.bytes`` defaults.
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
MAX_FETCH_WAIT_MS = 60_000


class FetchPartition(WireModel):
    """One partition to read, from the consumer's position in it."""

    model_config = examples({"topic": "orders", "partition": 0, "offset": 120})

    topic: TopicName
    partition: PartitionIndex
    offset: Offset = Field(description="First offset wanted.")
    max_records: int = Field(default=1000, ge=1, le=100_000)
    max_bytes: int = Field(
        default=DEFAULT_PARTITION_MAX_BYTES,
        ge=1,
        le=MAX_FETCH_BYTES,
        description="At most about this much of this partition's log (as the "
        "per-partition fetch's max_bytes).",
    )
    isolation_level: IsolationLevel | None = Field(
        default=None, description="This partition's isolation level (null: the request's)."
    )


class FetchManyRequest(WireModel):
    """``POST /v1/fetch``: read many partitions of this node in one request, each named
    once."""

    model_config = examples(
        {
            "isolation_level": "read_committed",
            "max_wait_ms": 500,
            "min_bytes": 1,
            "max_bytes": DEFAULT_FETCH_MAX_BYTES,
            "partitions": [
                {"topic": "orders", "partition": 0, "offset": 120, "max_records": 1000,
                 "max_bytes": DEFAULT_PARTITION_MAX_BYTES},
                {"topic": "orders", "partition": 3, "offset": 0,
                 "isolation_level": "read_uncommitted"},
            ],
        }
    )  # fmt: skip

    isolation_level: IsolationLevel = Field(
        default=IsolationLevel.READ_UNCOMMITTED,
        description="Of every partition that names none: read_committed stops at the last "
        "stable offset and leaves out the records of aborted transactions.",
    )
    max_wait_ms: int = Field(
        default=0,
        ge=0,
        le=MAX_FETCH_WAIT_MS,
        description="How long to wait for min_bytes when fewer are there (long poll).",
    )
    min_bytes: int = Field(
        default=1,
        ge=1,
        le=MAX_FETCH_BYTES,
        description="Answer at once when the records found, over every partition, take at "
        "least this many bytes of the answer's JSON.",
    )
    max_bytes: int = Field(
        default=DEFAULT_FETCH_MAX_BYTES,
        ge=1,
        le=MAX_FETCH_BYTES,
        description="At most this many bytes of records' JSON in the answer; the first "
        "partition with records gets at least one whatever its size, so a consumer always "
        "moves on.",
    )
    partitions: list[FetchPartition] = Field(min_length=1, max_length=MAX_FETCH_PARTITIONS)

    @model_validator(mode="after")
    def _each_partition_once(self) -> FetchManyRequest:
        seen: set[tuple[str, int]] = set()
        for asked in self.partitions:
            where = (asked.topic, asked.partition)
            if where in seen:
                raise ValueError(
                    f"{asked.topic}/{asked.partition} is named twice: one position per "
                    "partition per request"
                )
            seen.add(where)
        return self


class FetchedPartition(AnswerModel):
    """One partition's answer: its records from the asked offset (control records never)
    and its offsets, or the error that kept it from being read."""

    topic: str
    partition: int
    records: list[FetchedRecord]
    next_offset: int = Field(
        description="Where the next fetch of this partition starts (past any gap; the "
        "asked offset when it gave nothing or has an error)."
    )
    high_watermark: int = Field(description="-1 when the error leaves it unknown.")
    last_stable_offset: int = Field(description="-1 when the error leaves it unknown.")
    log_start_offset: int = Field(description="-1 when the error leaves it unknown.")
    error: ErrorBody | None = Field(
        default=None, description="Why this partition was not read (null: it was)."
    )


class FetchManyResponse(AnswerModel):
    """One entry per partition asked, in the order asked."""

    model_config = examples(
        {
            "partitions": [
                {
                    "topic": "orders", "partition": 0,
                    "records": [{"offset": 120, "key": "order-1", "value": '{"amount": 12}',
                                 "headers": {}, "timestamp_ms": 1700000000000,
                                 "encoding": "utf8"}],
                    "next_offset": 121, "high_watermark": 121, "last_stable_offset": 121,
                    "log_start_offset": 0, "error": None,
                },
                {
                    "topic": "orders", "partition": 3, "records": [], "next_offset": 0,
                    "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                    "error": {"code": "NOT_LEADER_OR_FOLLOWER",
                              "message": "node 1 is a follower; the leader is node 2 (epoch 4)",
                              "retriable": True},
                },
            ]
        }
    )  # fmt: skip

    partitions: list[FetchedPartition]


__all__ = [
    "DEFAULT_FETCH_MAX_BYTES",
    "DEFAULT_PARTITION_MAX_BYTES",
    "MAX_FETCH_BYTES",
    "MAX_FETCH_PARTITIONS",
    "MAX_FETCH_WAIT_MS",
    "FetchManyRequest",
    "FetchManyResponse",
    "FetchPartition",
    "FetchedPartition",
]
