"""EOS Python SDK: transactional and idempotent producers, consumer and admin over HTTP.

Blocking clients and their asyncio twins (``Async*``) behave alike::

    from sdk import Consumer, TransactionalProducer

    producer = TransactionalProducer("http://127.0.0.1:8080", "enricher-0")
    producer.init_transactions()
    with Consumer("http://127.0.0.1:8080", group_id="enricher") as consumer:
        consumer.assign([("orders", 0)])
        records = consumer.poll(timeout=1.0)
        with producer.transaction():
            for record in records:
                producer.send("enriched", f"{record.value}!", key=record.key)
            producer.send_offsets_to_transaction(
                {("orders", 0): consumer.position(("orders", 0))}, "enricher"
            )

A consumer that subscribes (``subscribe``) is a member of its group: the coordinator
shares the topics' partitions out among the members, and a transaction that commits the
consumer's offsets names the member (``consumer.group_metadata()``), so the offsets of a
member fenced meanwhile are refused (KIP-447).

Errors: the wire errors of ``eos_protocol.errors`` (``RetriableError``, ``AbortableError``,
``FatalError`` and their codes' classes) and the client's own (``ClientError`` tree).

Credentials: every client takes ``token=`` (a bearer token; default ``EOS_TOKEN``) and
``ca_file=`` (the CA bundle for ``https://`` services; default ``EOS_CA_FILE``).
"""

from eos_protocol.acl import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from eos_protocol.errors import (
    AbortableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    EosError,
    FatalError,
    FencedMemberEpochError,
    GroupAuthorizationFailedError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRecordError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    KafkaStorageError,
    MessageTooLargeError,
    NonEmptyGroupError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceNumberError,
    PlainError,
    ProducerFencedError,
    RetriableError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionAbortableError,
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
    TransactionCoordinatorFencedError,
    UnauthenticatedError,
    UnknownMemberIdError,
    UnknownProducerIdError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnstableOffsetCommitError,
    UnsupportedVersionError,
)
from sdk._config import USE_DEFAULT, RetryConfig, UseDefault
from sdk._errors import (
    ClientError,
    DeliveryTimeoutError,
    EosTimeoutError,
    IllegalStateError,
    NetworkError,
    ProducerClosedError,
    TransactionAbortedError,
)
from sdk._record_futures import AsyncRecordFutures, RecordFutures
from sdk._state import ProducerState
from sdk._types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from sdk.admin import AdminClient
from sdk.aio.admin import AsyncAdminClient
from sdk.aio.consumer import AsyncConsumer
from sdk.aio.producer import AsyncProducer, AsyncTransactionalProducer
from sdk.consumer import Consumer
from sdk.producer import Producer, TransactionalProducer

__all__ = [
    "USE_DEFAULT",
    "AbortableError",
    "AclBinding",
    "AclFilter",
    "AdminClient",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncRecordFutures",
    "AsyncTransactionalProducer",
    "ClientError",
    "ConcurrentTransactionsError",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "DeliveryTimeoutError",
    "EosError",
    "EosTimeoutError",
    "FatalError",
    "FencedMemberEpochError",
    "GroupAuthorizationFailedError",
    "GroupIdNotFoundError",
    "GroupMaxSizeReachedError",
    "IllegalStateError",
    "InvalidProducerEpochError",
    "InvalidProducerIdMappingError",
    "InvalidRecordError",
    "InvalidRegularExpressionError",
    "InvalidRequestError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "KafkaStorageError",
    "MessageTooLargeError",
    "NetworkError",
    "NonEmptyGroupError",
    "NotCoordinatorError",
    "NotLeaderOrFollowerError",
    "OffsetAndMetadata",
    "OffsetOutOfRangeError",
    "Operation",
    "OutOfOrderSequenceNumberError",
    "PatternType",
    "Permission",
    "PlainError",
    "Producer",
    "ProducerClosedError",
    "ProducerFencedError",
    "ProducerState",
    "RecordFutures",
    "RecordMetadata",
    "ResourceType",
    "RetriableError",
    "RetryConfig",
    "TopicAlreadyExistsError",
    "TopicAuthorizationFailedError",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionCoordinatorFencedError",
    "TransactionalIdAuthorizationFailedError",
    "TransactionalIdNotFoundError",
    "TransactionalProducer",
    "UnauthenticatedError",
    "UnknownMemberIdError",
    "UnknownProducerIdError",
    "UnknownTopicOrPartitionError",
    "UnreleasedInstanceIdError",
    "UnstableOffsetCommitError",
    "UnsupportedVersionError",
    "UseDefault",
]
