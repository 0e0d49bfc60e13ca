"""Wire models of the multi-partition produce, ``POST /v1/produce`` (docs/design.md §4).

One request to a storage node carries the batches of many partitions, as one Kafka
Produce request carries every partition the client has ready for that broker: the HTTP
work of a request (parsing, routing, the answer) is paid once for all of them. Each batch
keeps its own producer id, epoch, sequence, slot and transactional flag, and is answered
on its own: a batch refused (fenced, unknown partition, not the leader, out of order)
carries its error beside the others' offsets and never fails them.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from eos_protocol.common import (
    AnswerModel,
    ErrorBody,
    PartitionIndex,
    TopicName,
    WireModel,
    examples,
)
from eos_protocol.node import ProduceRequest

#: Batches in one request. A producer sends at most one batch per partition per request,
#: and the node's partitions are what bound it; the cap keeps one request's work (and the
#: answer's size) within what a node handles in one go.
MAX_BATCHES_PER_PRODUCE = 10_000


class PartitionBatch(ProduceRequest):
    """One partition's batch: the single-partition produce body plus where it goes."""

    model_config = examples(
        {"topic": "orders", "partition": 0, "producer_id": 1000, "producer_epoch": 0,
         "base_sequence": 0, "transactional": True,
         "records": [{"key": "order-1", "value": '{"amount": 12}'}]}
    )  # fmt: skip

    topic: TopicName
    partition: PartitionIndex


class ProduceManyRequest(WireModel):
    """``POST /v1/produce``: batches for many partitions led by this node, at most one per
    partition (the order of a partition's batches is its sequence order, and two batches
    of one partition in one request would leave it to the node)."""

    model_config = examples(
        {"batches": [
            {"topic": "orders", "partition": 0, "producer_id": 1000, "producer_epoch": 0,
             "base_sequence": 0, "records": [{"key": "order-1", "value": '{"amount": 12}'}]},
            {"topic": "orders", "partition": 1, "producer_id": 1000, "producer_epoch": 0,
             "base_sequence": 0, "records": [{"key": "order-2", "value": '{"amount": 7}'}]},
        ]}
    )  # fmt: skip

    batches: list[PartitionBatch] = Field(min_length=1, max_length=MAX_BATCHES_PER_PRODUCE)

    @model_validator(mode="after")
    def _one_batch_per_partition(self) -> ProduceManyRequest:
        seen: set[tuple[str, int]] = set()
        for batch in self.batches:
            where = (batch.topic, batch.partition)
            if where in seen:
                raise ValueError(
                    f"{batch.topic}/{batch.partition} is named twice: one batch per "
                    "partition per request"
                )
            seen.add(where)
        return self


class PartitionProduced(AnswerModel):
    """One batch's outcome: its offsets (the first ones it got, when ``duplicate``), or
    the error that refused it, in the envelope's error body."""

    topic: str
    partition: int
    base_offset: int | None = None
    last_offset: int | None = None
    duplicate: bool | None = None
    log_append_time_ms: int | None = None
    error: ErrorBody | None = None


class ProduceManyResponse(AnswerModel):
    """The batches' outcomes, in the order of the request."""

    model_config = examples(
        {"batches": [
            {"topic": "orders", "partition": 0, "base_offset": 42, "last_offset": 42,
             "duplicate": False, "log_append_time_ms": 1700000000000, "error": None},
            {"topic": "orders", "partition": 1, "base_offset": None, "last_offset": None,
             "duplicate": None, "log_append_time_ms": None,
             "error": {"code": "NOT_LEADER_OR_FOLLOWER", "retriable": True,
                       "message": "node 2 does not lead orders/1"}},
        ]}
    )  # fmt: skip

    batches: list[PartitionProduced]


__all__ = [
    "MAX_BATCHES_PER_PRODUCE",
    "PartitionBatch",
    "PartitionProduced",
    "ProduceManyRequest",
    "ProduceManyResponse",
]
