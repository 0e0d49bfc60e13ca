"""Client configuration, its defaults and the ``USE_DEFAULT`` sentinel.

Defaults are Kafka's producer and consumer defaults where Kafka has one. Timeouts of
individual calls take ``USE_DEFAULT`` (the configured value) as distinct from ``None``
(wait without a deadline), which is why a sentinel is needed at all.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from eos_protocol.addresses import parse_url_list
from eos_protocol.coordinator import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    MAX_TRANSACTION_TIMEOUT_MS,
    TRANSACTION_VERSION_1,
    TRANSACTION_VERSION_2,
)


class UseDefault(enum.Enum):
    """The type of ``USE_DEFAULT``: "the caller said nothing", unlike ``None``.

    Example::

        consumer.poll(timeout=USE_DEFAULT)  # the configured wait; timeout=None: no deadline
    """

    USE_DEFAULT = enum.auto()

    def __repr__(self) -> str:
        return "USE_DEFAULT"


USE_DEFAULT = UseDefault.USE_DEFAULT

#: A timeout argument: seconds, ``None`` for no deadline, or ``USE_DEFAULT``.
TimeoutArg = float | None | UseDefault


def resolve_timeout(value: TimeoutArg, default_ms: int | None) -> float | None:
    """Seconds to wait, or None for no deadline."""
    if value is USE_DEFAULT:
        return None if default_ms is None else default_ms / 1000
    return value


#: The rebalance timeouts a group member may ask for (the heartbeat's bounds).
MIN_REBALANCE_TIMEOUT_MS = 1_000
MAX_REBALANCE_TIMEOUT_MS = 3_600_000

#: A partition's batch closes at this many bytes (Kafka's ``batch.size`` is 16 KB). A
#: request over HTTP costs both sides far more than a Kafka request does (parsing,
#: routing, an answer of its own), so batches 16 times Kafka's carry the default producer
#: at about twice the records a second, keyed or not, and cost the nodes a third of the
#: CPU per record (``docs/benchmarks.md``, "wide"). ``linger_ms`` still bounds the wait
#: of a record when traffic is light: a batch leaves when full or after ``linger_ms``.
DEFAULT_BATCH_SIZE = 262_144


@dataclass(frozen=True)
class RetryConfig:
    """How requests are retried: exponential backoff between ``backoff_ms`` and
    ``backoff_max_ms`` (with jitter), ``fast_backoff_ms`` for CONCURRENT_TRANSACTIONS
    (Kafka retries it quickly because the previous transaction is about to complete).
    A produce attempt may take ``request_timeout_ms`` (it waits for the in-sync
    replicas), but is given up sooner once its partitions are led elsewhere. Everything
    answered at once may take only ``coordinator_timeout_ms``: a coordinator's calls
    (answered from memory or after one database write), a node's offsets calls, and a
    fetch beyond its long poll. One that takes longer is most likely at a paused or cut-off
    process: the attempt is made again, at whichever instance or leader serves it by then.
    A paused transaction coordinator therefore costs a client at most its lease time plus
    this.

    Example::

        producer = Producer(url, retry=RetryConfig(backoff_ms=50, request_timeout_ms=5_000))
    """

    backoff_ms: int = 100
    backoff_max_ms: int = 1_000
    fast_backoff_ms: int = 5
    request_timeout_ms: int = 30_000
    coordinator_timeout_ms: int = 5_000

    def __post_init__(self) -> None:
        if self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError("need 0 <= backoff_ms <= backoff_max_ms")
        if self.request_timeout_ms <= 0:
            raise ValueError("request_timeout_ms must be positive")
        if self.coordinator_timeout_ms <= 0:
            raise ValueError("coordinator_timeout_ms must be positive")


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of ``Producer`` and ``TransactionalProducer``.

    ``bootstrap_url`` is one coordinator URL or several (a comma-separated string or a
    list, like Kafka's ``bootstrap.servers``); the client learns the other live instances
    from the cluster and falls over between them.

    ``linger_ms`` and ``batch_size`` (bytes) shape the batches of each partition;
    ``max_in_flight`` (at most 5, Kafka's limit for idempotence) is how many batches of one
    partition may await their acknowledgement; ``delivery_timeout_ms`` bounds the time
    from ``send`` to the acknowledgement, retries included. ``buffer_memory`` (bytes,
    Kafka's ``buffer.memory``) bounds the records queued and not yet acknowledged: while
    they fill it, ``send`` and ``send_many`` wait for room, at most ``max_block_ms``, then
    raise ``EosTimeoutError`` (a producer that outruns its nodes pushes back on the
    application instead of growing without limit). ``token`` (default: the
    ``EOS_TOKEN`` variable) is sent as a bearer token; ``ca_file`` (default: ``EOS_CA_FILE``)
    is the CA bundle that ``https://`` services are verified against.

    ``transaction_version`` is the transaction protocol of a ``TransactionalProducer``
    (KIP-890). ``None``, the default, takes the highest version both the client and the
    cluster speak (the cluster names its versions in its metadata; one of an earlier
    release, which names none, speaks 1 only). 2 sends no add-partitions (the storage node
    adds each partition on the transaction's first batch there) and continues each
    transaction at the epoch its commit or abort bumped; init raises
    ``UnsupportedVersionError`` when the cluster does not speak it. 1 is the older flow,
    which every release speaks: one add-partitions call before the first batch to each
    partition. A coordinator that answers an init without the field speaks version 1.
    """

    bootstrap_url: str | Sequence[str]
    transactional_id: str | None = None
    transaction_version: int | None = None
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    linger_ms: int = 5
    batch_size: int = DEFAULT_BATCH_SIZE
    max_in_flight: int = 5
    delivery_timeout_ms: int = 120_000
    max_block_ms: int = 60_000
    buffer_memory: int = 33_554_432
    retry: RetryConfig = field(default_factory=RetryConfig)
    headers: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        parse_url_list(self.bootstrap_url, "bootstrap")
        if not 1 <= self.max_in_flight <= 5:
            raise ValueError("max_in_flight must be within 1..5 for an idempotent producer")
        if self.linger_ms < 0:
            raise ValueError("linger_ms must not be negative")
        if self.batch_size < 1:
            raise ValueError("batch_size must be positive")
        if self.buffer_memory < 1:
            raise ValueError("buffer_memory must be positive")
        if not 1 <= self.transaction_timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
            raise ValueError(
                f"transaction_timeout_ms must be within 1..{MAX_TRANSACTION_TIMEOUT_MS}"
            )
        if self.delivery_timeout_ms < self.linger_ms:
            raise ValueError("delivery_timeout_ms must be at least linger_ms")
        if self.transaction_version not in (None, TRANSACTION_VERSION_1, TRANSACTION_VERSION_2):
            raise ValueError("transaction_version must be 1, 2 or None (the highest both speak)")


@dataclass(frozen=True)
class ConsumerConfig:
    """Settings of ``Consumer``. ``auto_offset_reset`` applies when a partition has no
    committed offset (or the committed one is out of range): ``earliest`` or ``latest``.
    ``token`` and ``ca_file`` are as in ``ProducerConfig``. ``group_instance_id`` makes a
    subscribed consumer a static member (a restart under the same id gets its partitions
    back without a rebalance); ``rebalance_timeout_ms`` is how long it may take to let go
    of revoked partitions (None: the coordinator's default)."""

    bootstrap_url: str | Sequence[str]
    group_id: str | None = None
    isolation_level: str = "read_committed"
    auto_offset_reset: str = "earliest"
    max_poll_records: int = 500
    fetch_max_bytes: int = 1024 * 1024
    fetch_max_wait_ms: int = 500
    retry: RetryConfig = field(default_factory=RetryConfig)
    headers: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    ca_file: str | None = None
    group_instance_id: str | None = None
    rebalance_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        parse_url_list(self.bootstrap_url, "bootstrap")
        if self.group_instance_id is not None and not self.group_instance_id:
            raise ValueError("group_instance_id must not be empty")
        if self.rebalance_timeout_ms is not None and not (
            MIN_REBALANCE_TIMEOUT_MS <= self.rebalance_timeout_ms <= MAX_REBALANCE_TIMEOUT_MS
        ):
            raise ValueError(
                f"rebalance_timeout_ms must be within {MIN_REBALANCE_TIMEOUT_MS}.."
                f"{MAX_REBALANCE_TIMEOUT_MS}"
            )
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError("isolation_level is read_committed or read_uncommitted")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset is earliest or latest")
        if self.max_poll_records < 1:
            raise ValueError("max_poll_records must be positive")
