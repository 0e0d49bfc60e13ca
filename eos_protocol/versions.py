"""What a cluster understands: its release, its request protocol and its feature levels.

Clients and servers of neighbouring releases work together (Kafka's rule, KIP-35
ApiVersions): the coordinator names what it understands in ``features`` of
``GET /v1/metadata``, and a client sends only requests of that shape. Feature levels are
ranges, in the manner of Kafka's finalized features (KIP-584): ``transaction_version``
``{min: 1, max: 2}`` means the coordinator speaks both transaction versions.

A cluster that names no features is of an earlier release: it understands the oldest
shapes only (``PREVIOUS_RELEASE_FEATURES``: transaction version 1, no topic replication or
retention options). The same rule holds for each feature a newer answer leaves out, so a
later release may add features without breaking this client.

A client does not have to ask: the previous release's requests stay valid on this one
(no request gained a required field), so its clients are served as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import Field

from eos_protocol.common import AnswerModel, examples

#: This release. pyproject.toml's ``version`` says the same (tests/test_protocol.py).
RELEASE = "0.3.0"

#: KIP-890 part 1: the client adds every partition itself (add-partitions) before its
#: first batch there, and the storage node only verifies it. Every release speaks it.
TRANSACTION_VERSION_1 = 1
#: KIP-890 part 2: the storage node adds the partition on the first batch, and every
#: commit or abort bumps the producer epoch.
TRANSACTION_VERSION_2 = 2

#: The request protocol: bumped whenever a request gains a field or an endpoint is added,
#: so a client can tell which request shapes a coordinator takes.
#:
#: * 1: the releases before features were named (a cluster that says nothing).
#: * 2: ``transaction_version`` in init; ``replication_factor``, ``min_insync_replicas``,
#:   ``unclean_leader_election``, ``retention_ms`` and ``retention_bytes`` in topic
#:   creation; ``PATCH /v1/topics/{topic}``; ``/v1/admin/hanging-transactions``.
#: * 3: ``slot`` in a storage node's produce request and ``?slot=`` in its describe-producers
#:   (several sequence spaces under one producer: the Spark sink's tasks sharing one
#:   transaction).
#: * 4: ``DELETE /v1/topics/{topic}`` and the ``delete`` operation of topic ACLs; a storage
#:   node's ``POST /internal/v1/topics/delete``.
PROTOCOL_VERSION = 4
#: The protocol of a cluster whose metadata names no features.
PREVIOUS_PROTOCOL_VERSION = 1
#: The protocol of release 0.3.0: what a request added by it needs.
PROTOCOL_0_3_0 = 2
#: What a produce request naming a ``slot`` needs (older nodes refuse the field).
PROTOCOL_SLOTS = 3
#: What ``DELETE /v1/topics/{topic}`` needs.
PROTOCOL_TOPIC_DELETION = 4


class FeatureRange(AnswerModel):
    """The levels of one feature a cluster understands, ``min`` to ``max`` inclusive."""

    min: int = Field(ge=0, description="The lowest level understood.", examples=[1])
    max: int = Field(ge=0, description="The highest level understood.", examples=[2])

    def highest_common(self, lowest: int, highest: int) -> int | None:
        """The highest level both this range and ``lowest..highest`` hold, or None."""
        top = min(self.max, highest)
        return top if top >= max(self.min, lowest) else None

    def __str__(self) -> str:
        return str(self.min) if self.min == self.max else f"{self.min} to {self.max}"


def _transaction_version_1_only() -> FeatureRange:
    return FeatureRange(min=TRANSACTION_VERSION_1, max=TRANSACTION_VERSION_1)


class ClusterFeatures(AnswerModel):
    """What the answering coordinator understands (``features`` of ``GET /v1/metadata``).
    A field left out means the previous release's level of that feature."""

    model_config = examples(
        {"release": "0.3.0", "protocol": 4, "transaction_version": {"min": 1, "max": 2}}
    )

    release: str | None = Field(
        default=None,
        description="The coordinator's release (its package version).",
        examples=["0.3.0"],
    )
    protocol: int = Field(
        default=PREVIOUS_PROTOCOL_VERSION,
        ge=1,
        description="The request protocol, bumped whenever a request gains a field or an "
        "endpoint is added (1: the releases that named no features).",
        examples=[PROTOCOL_VERSION],
    )
    transaction_version: FeatureRange = Field(
        default_factory=_transaction_version_1_only,
        description="The transaction versions (KIP-890) an init may ask for.",
    )

    @property
    def release_name(self) -> str:
        """The release, as an error message names it."""
        return self.release or "a release that names no features"


#: What this release's coordinators answer.
CURRENT_FEATURES = ClusterFeatures(
    release=RELEASE,
    protocol=PROTOCOL_VERSION,
    transaction_version=FeatureRange(min=TRANSACTION_VERSION_1, max=TRANSACTION_VERSION_2),
)

#: What a cluster that names no features understands (its metadata has no ``features``):
#: release 0.1.0, the oldest shapes.
PREVIOUS_RELEASE_FEATURES = ClusterFeatures()

#: Release 0.2.0 named no features either, but already took protocol 2's requests and
#: transaction version 2. Its metadata is told apart from 0.1.0's by its ``coordinators``
#: list (the live coordinator instances), which 0.2.0 added.
RELEASE_0_2_0_FEATURES = ClusterFeatures(
    release="0.2.0",
    protocol=PROTOCOL_0_3_0,
    transaction_version=FeatureRange(min=TRANSACTION_VERSION_1, max=TRANSACTION_VERSION_2),
)


def features_of_metadata(metadata: Mapping[str, Any]) -> ClusterFeatures | Mapping[str, Any]:
    """The features a ``GET /v1/metadata`` answer stands for: those it names, else those
    of the release its shape gives away (0.2.0: a ``coordinators`` list; 0.1.0: none).
    Named features are returned raw, for the caller's model to read."""
    named = metadata.get("features")
    if named is not None:
        return cast(Mapping[str, Any], named)
    if "coordinators" in metadata:
        return RELEASE_0_2_0_FEATURES
    return PREVIOUS_RELEASE_FEATURES


__all__ = [
    "CURRENT_FEATURES",
    "PREVIOUS_PROTOCOL_VERSION",
    "PREVIOUS_RELEASE_FEATURES",
    "PROTOCOL_0_3_0",
    "PROTOCOL_SLOTS",
    "PROTOCOL_VERSION",
    "RELEASE",
    "RELEASE_0_2_0_FEATURES",
    "TRANSACTION_VERSION_1",
    "TRANSACTION_VERSION_2",
    "ClusterFeatures",
    "FeatureRange",
    "features_of_metadata",
]
