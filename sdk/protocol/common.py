"""Wire models shared by both services: the error envelope, partitions and limits."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Kafka's rule for topic names; group and transactional ids are free text of bounded size.
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TOPIC_NAME_RE = re.compile(TOPIC_NAME_PATTERN)
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
MAX_ID_LENGTH = 249
MAX_PARTITIONS_PER_TOPIC = 10_000
SEQUENCE_MODULUS = 2**31  # sequences wrap at 2^31 - 1 like Kafka's
MAX_PRODUCER_EPOCH = 32767  # a short, as in Kafka

TopicName = Annotated[str, Field(pattern=TOPIC_NAME_PATTERN, examples=["orders"])]
PartitionIndex = Annotated[int, Field(ge=0, lt=MAX_PARTITIONS_PER_TOPIC, examples=[0])]
ProducerId = Annotated[int, Field(ge=0, le=2**63 - 1, examples=[1000])]
ProducerEpoch = Annotated[int, Field(ge=0, le=MAX_PRODUCER_EPOCH, examples=[0])]
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]
IdString = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are refused so typos fail loudly."""

    model_config = ConfigDict(extra="forbid")


class ErrorBody(WireModel):
    code: str = Field(examples=["PRODUCER_FENCED"])
    message: str
    retriable: bool
    details: dict[str, object] | None = None


class ErrorEnvelope(WireModel):
    """Every error answer of every endpoint."""

    error: ErrorBody


class TopicPartition(WireModel):
    topic: TopicName
    partition: PartitionIndex


class Empty(WireModel):
    """An empty JSON object."""


class Health(WireModel):
    status: str = Field(examples=["ok"])
