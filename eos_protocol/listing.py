"""Wire model of a storage node's list of its partitions, as a client may read it
(``GET /v1/partitions`` on a node).

A view of many partitions at once — the web console's topics pages, an operator's
script — would otherwise ask each partition's leader twice per partition (offsets, then
DescribeProducers): 10,000 requests for a 5,000-partition cluster. This list answers the
same numbers for every partition a node holds in one request, filtered by the caller's
describe right on each topic as the coordinator's metadata is, and narrowed to one topic
and a range of its partitions when the view shows only those.

The coordinators' own list (``GET /internal/v1/partitions``, ``ListPartitionsResponse``)
stays as it is: it takes the internal token, which no client holds.
"""

from __future__ import annotations

from pydantic import Field

from eos_protocol.common import AnswerModel, examples
from eos_protocol.node import ProducerDescription


class NodePartition(AnswerModel):
    """One partition held by the node, as the node sees it now."""

    topic: str
    partition: int
    leader: bool = Field(
        description="This node leads the partition now (its own view). A follower's "
        "offsets trail the leader's: read a partition's numbers from its leader's row."
    )
    leader_epoch: int | None = Field(
        description="The leader epoch of the node's assignment (null: unreplicated, "
        "never assigned by the controller)."
    )
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int = Field(
        description="The first offset of the oldest open transaction (the high watermark "
        "when none is open): read_committed consumers read below it."
    )
    log_end_offset: int = Field(description="The offset the next record written here gets.")
    producer_count: int = Field(description="Producer ids with state on the partition.")
    producers: list[ProducerDescription] | None = Field(
        default=None,
        description="With producers=true: the partition's DescribeProducers answer "
        "(last_sequence of slot 0); absent otherwise.",
    )


class NodePartitionsResponse(AnswerModel):
    """The partitions a node holds that the caller may describe, by topic and index."""

    model_config = examples(
        {
            "node_id": 1,
            "partitions": [
                {
                    "topic": "orders", "partition": 0, "leader": True, "leader_epoch": 3,
                    "log_start_offset": 0, "high_watermark": 12, "last_stable_offset": 10,
                    "log_end_offset": 12, "producer_count": 1,
                },
            ],
        }
    )  # fmt: skip

    node_id: int
    partitions: list[NodePartition]


__all__ = ["NodePartition", "NodePartitionsResponse"]
