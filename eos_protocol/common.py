"""Wire models shared by both services: the error envelope, partitions and limits."""

from __future__ import annotations

import re
from typing import Annotated, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

# Kafka's rule for topic names; group and transactional ids are free text of bounded size.
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TOPIC_NAME_RE = re.compile(TOPIC_NAME_PATTERN)
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
MAX_ID_LENGTH = 249
MAX_PARTITIONS_PER_TOPIC = 10_000
SEQUENCE_MODULUS = 2**31  # sequences wrap at 2^31 - 1 like Kafka's
#: The largest leader or partition epoch a request may name (Kafka's are 32-bit): an
#: epoch past it could never be reached by bumps, and would not fit the answers' integers.
MAX_EPOCH = 2**31 - 1
MAX_PRODUCER_EPOCH = 32767  # a short, as in Kafka



def topic_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a topic (Kafka's rule), or None when it can.

    ``.`` and ``..`` match the character rule but are refused: as path segments they
    would be removed by URL normalisation, and on disk they name directories.
    """
    if not TOPIC_NAME_RE.match(name):
        return "a topic name is 1 to 249 characters of A-Z, a-z, 0-9, '.', '_' and '-'"
    if name in (".", ".."):
        return f"{name!r} is not a legal topic name"
    return None


def _check_topic_name(name: str) -> str:
    problem = topic_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


TopicName = Annotated[
    str,
    Field(pattern=TOPIC_NAME_PATTERN, examples=["orders"]),
    AfterValidator(_check_topic_name),
]
PartitionIndex = Annotated[int, Field(ge=0, lt=MAX_PARTITIONS_PER_TOPIC, examples=[0])]
ProducerId = Annotated[int, Field(ge=0, le=2**63 - 1, examples=[1000])]
ProducerEpoch = Annotated[int, Field(ge=0, le=MAX_PRODUCER_EPOCH, examples=[0])]
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]
IdString = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]


class WireModel(BaseModel):
    """Base of every model a request carries: unknown fields are refused, so a typo in a
    request fails loudly instead of being dropped. Models that answers carry too
    (``TopicPartition``, ``AclBinding``) are read leniently by ``read_answer``."""

    model_config = ConfigDict(extra="forbid")


class AnswerModel(WireModel):
    """Base of every model only answers carry: unknown fields are ignored, so a service
    may add a field to an answer without breaking a deployed client (Kafka's tagged
    fields serve the same end)."""

    model_config = ConfigDict(extra="ignore")


ModelT = TypeVar("ModelT", bound=BaseModel)


def read_answer(model: type[ModelT], body: object) -> ModelT:
    """An answer's body as ``model``, ignoring fields this version does not know, at
    every depth: the one way clients and services read each other's answers."""
    return model.model_validate(body, extra="ignore")


def read_answer_json(model: type[ModelT], content: bytes | str) -> ModelT:
    """``read_answer`` straight from the JSON bytes (no intermediate dicts)."""
    return model.model_validate_json(content, extra="ignore")


def examples(*items: JsonDict) -> ConfigDict:
    """A model config with examples for the OpenAPI schema (the base class keeps its
    own ``extra`` rule: pydantic merges the two)."""
    return ConfigDict(json_schema_extra={"examples": list(items)})


class ValidationProblem(AnswerModel):
    """One problem found by schema validation (a 422 answer)."""

    loc: list[str] = Field(description="Where the problem is.", examples=[["body", "records"]])
    msg: str = Field(description="What is wrong.", examples=["Field required"])


class ErrorDetails(BaseModel):
    """Extra facts some errors carry; other keys may appear and should be ignored."""

    model_config = ConfigDict(extra="allow")

    coordinator_url: str | None = Field(
        default=None,
        description="NOT_COORDINATOR: the URL of the coordinator that owns the id.",
        examples=["http://127.0.0.1:8080"],
    )
    node_id: int | None = Field(
        default=None, description="NOT_COORDINATOR: the owner's node id.", examples=[1]
    )
    problems: list[ValidationProblem] | None = Field(
        default=None, description="INVALID_REQUEST (422): every schema validation problem."
    )


class ErrorBody(AnswerModel):
    code: str = Field(
        description="A code of the error catalogue (docs/design.md §4).",
        examples=["PRODUCER_FENCED"],
    )
    message: str = Field(
        description="Human-readable; do not parse.",
        examples=["producer epoch 0 is older than the current epoch 1"],
    )
    retriable: bool = Field(description="Whether the same request may succeed later.")
    details: ErrorDetails | None = None


class ErrorEnvelope(AnswerModel):
    """Every error answer of every endpoint: ``{"error": {"code", "message", "retriable"}}``."""

    error: ErrorBody


class TopicPartition(WireModel):
    topic: TopicName
    partition: PartitionIndex


class Empty(WireModel):
    """An empty JSON object: ``{}``."""


class Health(AnswerModel):
    status: str = Field(examples=["ok"])
