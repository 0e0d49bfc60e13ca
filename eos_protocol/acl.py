"""Wire models of access control: ACL bindings, their filters and the snapshot nodes cache.

The model is Kafka's (``kafka-acls``): a binding allows or denies one principal one
operation on the resources one pattern names. A pattern is a literal name (``"*"`` names
every resource of its type) or a prefix. Deny wins over allow; with no binding allowing it,
a request is refused (Kafka's ``allow.everyone.if.no.acl.found=false``), except for the
super users named in the coordinator's settings.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from eos_protocol.common import MAX_ID_LENGTH, AnswerModel, WireModel, examples

#: The name of the one cluster resource (Kafka's ``kafka-cluster``).
CLUSTER_RESOURCE = "cluster"
WILDCARD = "*"
PRINCIPAL_PATTERN = r"^User:(\*|[A-Za-z0-9._@+=-]{1,128})$"
PRINCIPAL_RE = re.compile(PRINCIPAL_PATTERN)

Principal = Annotated[
    str,
    Field(
        pattern=PRINCIPAL_PATTERN,
        description="`User:<name>`; `User:*` matches every authenticated principal.",
        examples=["User:etl"],
    ),
]


class ResourceType(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional_id"
    CLUSTER = "cluster"


class Operation(StrEnum):
    """What a binding allows or denies. ``all`` covers every operation; ``read``, ``write``,
    ``alter`` and ``delete`` each imply ``describe``, as in Kafka."""

    ALL = "all"
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DESCRIBE = "describe"
    ALTER = "alter"
    DELETE = "delete"


class PatternType(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Permission(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


#: The operations that mean something on each resource type (``all`` is valid on each).
OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset(
        {
            Operation.READ,
            Operation.WRITE,
            Operation.CREATE,
            Operation.DESCRIBE,
            Operation.ALTER,
            Operation.DELETE,
            Operation.ALL,
        }
    ),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DESCRIBE, Operation.ALL}),
    ResourceType.TRANSACTIONAL_ID: frozenset(
        {Operation.WRITE, Operation.DESCRIBE, Operation.ALL}
    ),
    ResourceType.CLUSTER: frozenset(
        {Operation.ALTER, Operation.DESCRIBE, Operation.CREATE, Operation.ALL}
    ),
}


class AclBinding(WireModel):
    """One rule. Two bindings with the same fields are the same rule."""

    model_config = examples(
        {
            "principal": "User:etl",
            "resource_type": "topic",
            "resource_name": "orders-",
            "pattern_type": "prefixed",
            "operation": "write",
            "permission": "allow",
        }
    )

    principal: Principal
    resource_type: ResourceType
    resource_name: str = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="A name, a prefix (pattern_type prefixed) or `*` for every resource; "
        "the cluster resource is named `cluster`.",
    )
    pattern_type: PatternType = PatternType.LITERAL
    operation: Operation
    permission: Permission = Permission.ALLOW

    @model_validator(mode="after")
    def _coherent(self) -> AclBinding:
        if self.operation not in OPERATIONS[self.resource_type]:
            allowed = ", ".join(sorted(op.value for op in OPERATIONS[self.resource_type]))
            raise ValueError(
                f"operation {self.operation.value} does not apply to a "
                f"{self.resource_type.value}; use one of {allowed}"
            )
        if self.resource_type is ResourceType.CLUSTER and (
            self.resource_name != CLUSTER_RESOURCE or self.pattern_type is not PatternType.LITERAL
        ):
            raise ValueError(f"the cluster resource is the literal name {CLUSTER_RESOURCE!r}")
        if self.pattern_type is PatternType.PREFIXED and self.resource_name == WILDCARD:
            raise ValueError("'*' is a literal pattern (every resource), not a prefix")
        return self

    def key(self) -> tuple[str, str, str, str, str, str]:
        return (
            self.principal, self.resource_type.value, self.resource_name,
            self.pattern_type.value, self.operation.value, self.permission.value,
        )


class AclFilter(WireModel):
    """Matches the bindings whose given fields are equal; an absent field matches any."""

    model_config = examples({"principal": "User:etl", "resource_type": "topic"})

    principal: Principal | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    pattern_type: PatternType | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def matches(self, binding: AclBinding) -> bool:
        return all(
            wanted is None or wanted == getattr(binding, name)
            for name, wanted in self.model_dump().items()
        )


class CreateAclsRequest(WireModel):
    acls: list[AclBinding] = Field(min_length=1, max_length=1000)


class DeleteAclsRequest(WireModel):
    filters: list[AclFilter] = Field(
        min_length=1, max_length=1000, description="Every binding a filter matches is deleted."
    )


class AclsResponse(AnswerModel):
    acls: list[AclBinding]


class DeleteAclsResponse(AnswerModel):
    deleted: list[AclBinding]


class AclSnapshot(AnswerModel):
    """What storage nodes cache (``GET /internal/v1/acls``): every rule and the super users."""

    super_users: list[Principal]
    acls: list[AclBinding]
