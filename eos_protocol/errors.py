"""The error catalogue: every code of the wire contract, its HTTP status and its class.

Each service raises these; each boundary translates them exactly once (storage error ->
coordinator error -> HTTP envelope -> SDK exception). The envelope on the wire is::

    {"error": {"code": "PRODUCER_FENCED", "message": "...", "retriable": false}}

The exception tree::

    EosError                           any error of the contract (code, status, message)
    ├── RetriableError                 try again: the same request may succeed later
    │   ├── NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError
    │   ├── ConcurrentTransactionsError, NotLeaderOrFollowerError
    │   ├── UnstableOffsetCommitError, KafkaStorageError, LeaderNotAvailableError
    │   ├── NotEnoughReplicasError, NotEnoughReplicasAfterAppendError
    │   └── FencedLeaderEpochError, UnknownLeaderEpochError
    ├── AbortableError                 the transaction must be aborted, the producer lives on
    │   ├── OutOfOrderSequenceNumberError, UnknownProducerIdError, TransactionAbortableError
    │   ├── TopicAuthorizationFailedError, GroupAuthorizationFailedError
    │   ├── FencedMemberEpochError, UnknownMemberIdError   (a group member was fenced)
    │   └── MessageTooLargeError, InvalidRecordError, UnknownTopicOrPartitionError
    ├── FatalError                     the producer instance is finished: close it
    │   ├── ProducerFencedError, InvalidProducerEpochError, InvalidProducerIdMappingError
    │   ├── InvalidTxnStateError, TransactionCoordinatorFencedError
    │   ├── InvalidTransactionTimeoutError, TransactionalIdNotFoundError
    │   ├── UnsupportedVersionError
    │   └── UnauthenticatedError, TransactionalIdAuthorizationFailedError,
    │       ClusterAuthorizationFailedError
    └── (plain)                        request errors that say nothing about a producer
        InvalidRequestError, TopicAlreadyExistsError, OffsetOutOfRangeError,
        NotFoundError, InternalError, UnreleasedInstanceIdError,
        GroupMaxSizeReachedError, GroupIdNotFoundError, NonEmptyGroupError,
        InvalidRegularExpressionError

Beyond docs/design.md §4 the catalogue adds ``OFFSET_OUT_OF_RANGE`` (416, a fetch past the log
end), ``NOT_FOUND`` (404, an unknown path) and ``INTERNAL_ERROR`` (500, a bug: never expected).
``UNSUPPORTED_VERSION`` (Kafka's name) is raised by a client instead of a request the
cluster's features say it would not understand, or in place of an older coordinator's
refusal of one ("Versions and compatibility" in docs/design.md): fatal, since the same
producer would ask for the same again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar


class ErrorClass(StrEnum):
    """How a client reacts to an error."""

    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    PLAIN = "plain"


@dataclass(frozen=True)
class ErrorSpec:
    """One row of the catalogue."""

    code: str
    http_status: int
    error_class: ErrorClass
    description: str

    @property
    def retriable(self) -> bool:
        return self.error_class is ErrorClass.RETRIABLE

    @property
    def abortable(self) -> bool:
        return self.error_class is ErrorClass.ABORTABLE

    @property
    def fatal(self) -> bool:
        return self.error_class is ErrorClass.FATAL


class EosError(Exception):
    """An error of the wire contract. Subclasses fix ``code``; the catalogue fixes the rest."""

    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str = "", *, details: dict[str, Any] | None = None) -> None:
        self.message = message or CATALOGUE[self.code].description
        self.details = details or {}
        super().__init__(f"{self.code}: {self.message}")

    @property
    def spec(self) -> ErrorSpec:
        return CATALOGUE[self.code]

    @property
    def http_status(self) -> int:
        return self.spec.http_status

    @property
    def retriable(self) -> bool:
        return self.spec.retriable

    def envelope(self) -> dict[str, Any]:
        """The JSON body that carries this error on the wire."""
        body: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
        }
        if self.details:
            body["details"] = self.details
        return {"error": body}


class RetriableError(EosError):
    """The same request may succeed if sent again after a backoff."""


class AbortableError(EosError):
    """The current transaction cannot commit; abort it and carry on."""


class FatalError(EosError):
    """The producer can do nothing more; it must be closed (and a new one initialised)."""


class PlainError(EosError):
    """A request error that says nothing about the producer's state."""


def _define(
    name: str, code: str, status: int, base: type[EosError], description: str
) -> type[EosError]:
    cls = type(name, (base,), {"code": code, "__doc__": description})
    return cls


_ROWS: list[tuple[str, str, int, type[EosError], str]] = [
    # 400
    (
        "InvalidRequestError",
        "INVALID_REQUEST",
        400,
        PlainError,
        "The request is malformed or its values are out of range.",
    ),
    (
        "InvalidTransactionTimeoutError",
        "INVALID_TRANSACTION_TIMEOUT",
        400,
        FatalError,
        "The transaction timeout is larger than the coordinator's maximum or not positive.",
    ),
    (
        "UnsupportedVersionError",
        "UNSUPPORTED_VERSION",
        400,
        FatalError,
        "The request needs a version or feature the cluster does not support (its release "
        "is older than the client's).",
    ),
    (
        "InvalidRecordError",
        "INVALID_RECORD",
        400,
        AbortableError,
        "A record is not valid (for example bad base64 or an empty batch).",
    ),
    # 401 / 403
    (
        "UnauthenticatedError",
        "UNAUTHENTICATED",
        401,
        FatalError,
        "The request carries no valid credentials.",
    ),
    (
        "TransactionalIdAuthorizationFailedError",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        403,
        FatalError,
        "The principal may not use this transactional id.",
    ),
    (
        "TopicAuthorizationFailedError",
        "TOPIC_AUTHORIZATION_FAILED",
        403,
        AbortableError,
        "The principal may not access this topic.",
    ),
    (
        "GroupAuthorizationFailedError",
        "GROUP_AUTHORIZATION_FAILED",
        403,
        AbortableError,
        "The principal may not access this consumer group.",
    ),
    (
        "ClusterAuthorizationFailedError",
        "CLUSTER_AUTHORIZATION_FAILED",
        403,
        FatalError,
        "The principal may not perform cluster operations.",
    ),
    # 404
    (
        "UnknownTopicOrPartitionError",
        "UNKNOWN_TOPIC_OR_PARTITION",
        404,
        AbortableError,
        "The topic or partition does not exist here.",
    ),
    (
        "TransactionalIdNotFoundError",
        "TRANSACTIONAL_ID_NOT_FOUND",
        404,
        FatalError,
        "The transactional id is not known to the coordinator.",
    ),
    (
        "UnknownProducerIdError",
        "UNKNOWN_PRODUCER_ID",
        404,
        AbortableError,
        "The storage node has no state for this producer id.",
    ),
    ("NotFoundError", "NOT_FOUND", 404, PlainError, "No such path."),
    # 409
    (
        "ProducerFencedError",
        "PRODUCER_FENCED",
        409,
        FatalError,
        "A newer producer with the same transactional id has fenced this one.",
    ),
    (
        "InvalidProducerEpochError",
        "INVALID_PRODUCER_EPOCH",
        409,
        FatalError,
        "The producer epoch is older than the current one.",
    ),
    (
        "InvalidTxnStateError",
        "INVALID_TXN_STATE",
        409,
        FatalError,
        "The request is not valid in the transaction's current state.",
    ),
    (
        "InvalidProducerIdMappingError",
        "INVALID_PRODUCER_ID_MAPPING",
        409,
        FatalError,
        "The producer id does not belong to this transactional id.",
    ),
    (
        "OutOfOrderSequenceNumberError",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        409,
        AbortableError,
        "The batch's sequence number leaves a gap after the last one written.",
    ),
    (
        "TransactionCoordinatorFencedError",
        "TRANSACTION_COORDINATOR_FENCED",
        409,
        FatalError,
        "A coordinator with a newer coordinator epoch has taken over.",
    ),
    (
        "TopicAlreadyExistsError",
        "TOPIC_ALREADY_EXISTS",
        409,
        PlainError,
        "A topic with this name exists already.",
    ),
    (
        "TransactionAbortableError",
        "TRANSACTION_ABORTABLE",
        409,
        AbortableError,
        "The transaction cannot commit and must be aborted.",
    ),
    # 413 / 416
    (
        "MessageTooLargeError",
        "MESSAGE_TOO_LARGE",
        413,
        AbortableError,
        "A record or the batch is larger than the node accepts.",
    ),
    (
        "OffsetOutOfRangeError",
        "OFFSET_OUT_OF_RANGE",
        416,
        PlainError,
        "The offset is outside the partition's log.",
    ),
    # 500
    ("InternalError", "INTERNAL_ERROR", 500, PlainError, "An unexpected error."),
    # 503
    (
        "NotCoordinatorError",
        "NOT_COORDINATOR",
        503,
        RetriableError,
        "This instance is not the coordinator for the key.",
    ),
    (
        "CoordinatorNotAvailableError",
        "COORDINATOR_NOT_AVAILABLE",
        503,
        RetriableError,
        "The coordinator cannot be reached or is not ready.",
    ),
    (
        "CoordinatorLoadInProgressError",
        "COORDINATOR_LOAD_IN_PROGRESS",
        503,
        RetriableError,
        "The coordinator is still loading its state.",
    ),
    (
        "ConcurrentTransactionsError",
        "CONCURRENT_TRANSACTIONS",
        503,
        RetriableError,
        "A previous transaction of this producer is still completing.",
    ),
    (
        "NotLeaderOrFollowerError",
        "NOT_LEADER_OR_FOLLOWER",
        503,
        RetriableError,
        "This node does not lead the partition.",
    ),
    (
        "UnstableOffsetCommitError",
        "UNSTABLE_OFFSET_COMMIT",
        503,
        RetriableError,
        "A transaction holds pending offsets for this group.",
    ),
    (
        "KafkaStorageError",
        "KAFKA_STORAGE_ERROR",
        503,
        RetriableError,
        "The node could not read or write its storage.",
    ),
    (
        "LeaderNotAvailableError",
        "LEADER_NOT_AVAILABLE",
        503,
        RetriableError,
        "The partition has no live leader now (an election is under way or no in-sync "
        "replica is alive).",
    ),
    (
        "NotEnoughReplicasError",
        "NOT_ENOUGH_REPLICAS",
        503,
        RetriableError,
        "Fewer in-sync replicas than min_insync_replicas: nothing was written.",
    ),
    (
        "NotEnoughReplicasAfterAppendError",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        503,
        RetriableError,
        "The batch was written, but the in-sync replicas fell below min_insync_replicas "
        "before it was replicated; a retry is recognised as a duplicate.",
    ),
    (
        "FencedLeaderEpochError",
        "FENCED_LEADER_EPOCH",
        409,
        RetriableError,
        "The request carries an older leader epoch than the partition's: refresh the "
        "metadata and go to the current leader.",
    ),
    (
        "UnknownLeaderEpochError",
        "UNKNOWN_LEADER_EPOCH",
        409,
        RetriableError,
        "The request carries a newer leader epoch than this replica knows yet.",
    ),
    # consumer groups (KIP-848, KIP-447)
    (
        "FencedMemberEpochError",
        "FENCED_MEMBER_EPOCH",
        409,
        AbortableError,
        "The group member's epoch is not its current one: it was fenced (its partitions may "
        "belong to another member now). A transaction carrying it must abort; the member "
        "joins again with epoch 0.",
    ),
    (
        "UnknownMemberIdError",
        "UNKNOWN_MEMBER_ID",
        404,
        AbortableError,
        "The group has no such member (it left or was removed after its session timed "
        "out). A transaction carrying it must abort; the member joins again.",
    ),
    (
        "UnreleasedInstanceIdError",
        "UNRELEASED_INSTANCE_ID",
        409,
        PlainError,
        "Another member with this static instance id is still in the group.",
    ),
    (
        "GroupMaxSizeReachedError",
        "GROUP_MAX_SIZE_REACHED",
        409,
        PlainError,
        "The group has as many members as the coordinator allows.",
    ),
    (
        "GroupIdNotFoundError",
        "GROUP_ID_NOT_FOUND",
        404,
        PlainError,
        "No group by this id is on record.",
    ),
    (
        "NonEmptyGroupError",
        "NON_EMPTY_GROUP",
        409,
        PlainError,
        "The group still has members; the operation needs an empty group.",
    ),
    (
        "InvalidRegularExpressionError",
        "INVALID_REGULAR_EXPRESSION",
        400,
        PlainError,
        "The subscription's regular expression does not compile.",
    ),
]

_CLASS_OF_BASE = {
    RetriableError: ErrorClass.RETRIABLE,
    AbortableError: ErrorClass.ABORTABLE,
    FatalError: ErrorClass.FATAL,
    PlainError: ErrorClass.PLAIN,
}

CATALOGUE: dict[str, ErrorSpec] = {
    code: ErrorSpec(code, status, _CLASS_OF_BASE[base], description)
    for _name, code, status, base, description in _ROWS
}
ERROR_CLASSES: dict[str, type[EosError]] = {
    code: _define(name, code, status, base, description)
    for name, code, status, base, description in _ROWS
}


def error_for(code: str, message: str = "", details: dict[str, Any] | None = None) -> EosError:
    """Build the exception for a code received on the wire (unknown codes become internal)."""
    cls = ERROR_CLASSES.get(code, ERROR_CLASSES["INTERNAL_ERROR"])
    return cls(message or f"{code}", details=details)


def codes_with_status(status: int) -> list[str]:
    """All codes that travel with this HTTP status (used in the OpenAPI documents)."""
    return [spec.code for spec in CATALOGUE.values() if spec.http_status == status]


# Named classes, so code can raise and catch them by name.
InvalidRequestError = ERROR_CLASSES["INVALID_REQUEST"]
InvalidTransactionTimeoutError = ERROR_CLASSES["INVALID_TRANSACTION_TIMEOUT"]
InvalidRecordError = ERROR_CLASSES["INVALID_RECORD"]
UnsupportedVersionError = ERROR_CLASSES["UNSUPPORTED_VERSION"]
UnauthenticatedError = ERROR_CLASSES["UNAUTHENTICATED"]
TransactionalIdAuthorizationFailedError = ERROR_CLASSES["TRANSACTIONAL_ID_AUTHORIZATION_FAILED"]
TopicAuthorizationFailedError = ERROR_CLASSES["TOPIC_AUTHORIZATION_FAILED"]
GroupAuthorizationFailedError = ERROR_CLASSES["GROUP_AUTHORIZATION_FAILED"]
ClusterAuthorizationFailedError = ERROR_CLASSES["CLUSTER_AUTHORIZATION_FAILED"]
UnknownTopicOrPartitionError = ERROR_CLASSES["UNKNOWN_TOPIC_OR_PARTITION"]
TransactionalIdNotFoundError = ERROR_CLASSES["TRANSACTIONAL_ID_NOT_FOUND"]
UnknownProducerIdError = ERROR_CLASSES["UNKNOWN_PRODUCER_ID"]
NotFoundError = ERROR_CLASSES["NOT_FOUND"]
ProducerFencedError = ERROR_CLASSES["PRODUCER_FENCED"]
InvalidProducerEpochError = ERROR_CLASSES["INVALID_PRODUCER_EPOCH"]
InvalidTxnStateError = ERROR_CLASSES["INVALID_TXN_STATE"]
InvalidProducerIdMappingError = ERROR_CLASSES["INVALID_PRODUCER_ID_MAPPING"]
OutOfOrderSequenceNumberError = ERROR_CLASSES["OUT_OF_ORDER_SEQUENCE_NUMBER"]
TransactionCoordinatorFencedError = ERROR_CLASSES["TRANSACTION_COORDINATOR_FENCED"]
TopicAlreadyExistsError = ERROR_CLASSES["TOPIC_ALREADY_EXISTS"]
TransactionAbortableError = ERROR_CLASSES["TRANSACTION_ABORTABLE"]
MessageTooLargeError = ERROR_CLASSES["MESSAGE_TOO_LARGE"]
OffsetOutOfRangeError = ERROR_CLASSES["OFFSET_OUT_OF_RANGE"]
InternalError = ERROR_CLASSES["INTERNAL_ERROR"]
NotCoordinatorError = ERROR_CLASSES["NOT_COORDINATOR"]
CoordinatorNotAvailableError = ERROR_CLASSES["COORDINATOR_NOT_AVAILABLE"]
CoordinatorLoadInProgressError = ERROR_CLASSES["COORDINATOR_LOAD_IN_PROGRESS"]
ConcurrentTransactionsError = ERROR_CLASSES["CONCURRENT_TRANSACTIONS"]
NotLeaderOrFollowerError = ERROR_CLASSES["NOT_LEADER_OR_FOLLOWER"]
UnstableOffsetCommitError = ERROR_CLASSES["UNSTABLE_OFFSET_COMMIT"]
KafkaStorageError = ERROR_CLASSES["KAFKA_STORAGE_ERROR"]
LeaderNotAvailableError = ERROR_CLASSES["LEADER_NOT_AVAILABLE"]
NotEnoughReplicasError = ERROR_CLASSES["NOT_ENOUGH_REPLICAS"]
NotEnoughReplicasAfterAppendError = ERROR_CLASSES["NOT_ENOUGH_REPLICAS_AFTER_APPEND"]
FencedLeaderEpochError = ERROR_CLASSES["FENCED_LEADER_EPOCH"]
UnknownLeaderEpochError = ERROR_CLASSES["UNKNOWN_LEADER_EPOCH"]
FencedMemberEpochError = ERROR_CLASSES["FENCED_MEMBER_EPOCH"]
UnknownMemberIdError = ERROR_CLASSES["UNKNOWN_MEMBER_ID"]
UnreleasedInstanceIdError = ERROR_CLASSES["UNRELEASED_INSTANCE_ID"]
GroupMaxSizeReachedError = ERROR_CLASSES["GROUP_MAX_SIZE_REACHED"]
GroupIdNotFoundError = ERROR_CLASSES["GROUP_ID_NOT_FOUND"]
NonEmptyGroupError = ERROR_CLASSES["NON_EMPTY_GROUP"]
InvalidRegularExpressionError = ERROR_CLASSES["INVALID_REGULAR_EXPRESSION"]
