"""The retry rule of every request the SDK makes, in one table, and the verdict on a failure.

Every request has a row in ``POLICIES``: whether it is idempotent (so a network error or
timeout, after which the server may or may not have applied it, can be retried), which
retriable codes it retries, and which of them mean "find the coordinator again".
``classify`` reads that row; the transports (``sdk._transport``) retry from it, and the
producer's sender uses the same verdicts for produce requests, which it reschedules itself
so that the order of a partition's batches survives retries. Kept apart from the
transports so the table reads as one page.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

import httpx

from eos_protocol.errors import EosError
from sdk._config import RetryConfig


class Req(enum.StrEnum):
    """Every kind of request the SDK sends."""

    METADATA = "metadata"
    TOPIC = "topic"
    CREATE_TOPIC = "create_topic"
    ALTER_TOPIC = "alter_topic"
    DELETE_TOPIC = "delete_topic"
    FIND_COORDINATOR = "find_coordinator"
    INIT_PRODUCER_ID = "init_producer_id"
    INIT_TRANSACTIONS = "init_transactions"
    ADD_PARTITIONS = "add_partitions"
    ADD_OFFSETS = "add_offsets"
    END_TXN = "end_txn"
    PRODUCE = "produce"
    FETCH = "fetch"
    LIST_OFFSETS = "list_offsets"
    OFFSET_COMMIT = "offset_commit"
    TXN_OFFSET_COMMIT = "txn_offset_commit"
    OFFSET_FETCH = "offset_fetch"
    GROUP_HEARTBEAT = "group_heartbeat"
    LIST_TRANSACTIONS = "list_transactions"
    DESCRIBE_TRANSACTION = "describe_transaction"
    DESCRIBE_PRODUCERS = "describe_producers"
    FORCE_ABORT = "force_abort"
    LIST_ACLS = "list_acls"
    CREATE_ACLS = "create_acls"
    DELETE_ACLS = "delete_acls"
    LIST_GROUPS = "list_groups"
    DESCRIBE_GROUP = "describe_group"
    DELETE_GROUP = "delete_group"
    RESET_GROUP_OFFSETS = "reset_group_offsets"


class Verdict(enum.Enum):
    RETRY = "retry"  # send the same request again after a backoff
    REFIND = "refind"  # find the coordinator (or leader) again, then retry
    FAIL = "fail"  # give the error to the caller


_ROUTING = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"})
_ALL_RETRIABLE = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
     "CONCURRENT_TRANSACTIONS", "NOT_LEADER_OR_FOLLOWER", "UNSTABLE_OFFSET_COMMIT",
     "KAFKA_STORAGE_ERROR"}
)  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """The retry rule of one kind of request.

    ``idempotent``: sending it twice has the effect of sending it once, so an unknown
    outcome (connection lost, timeout, a bare 502/503/504) may be retried. ``retriable``:
    the error codes worth another attempt. ``refind``: codes after which the target is
    looked up again. ``in_place``: the transport retries it; if false the caller does.
    ``coordinator``: it is answered at once (by a coordinator, or a node's offsets
    calls), so one attempt may take only ``coordinator_timeout_ms`` (otherwise
    ``request_timeout_ms``).
    """

    idempotent: bool
    retriable: frozenset[str] = _ALL_RETRIABLE
    refind: frozenset[str] = _ROUTING
    in_place: bool = True
    coordinator: bool = True


# Kafka's metadata errors: the partition is not (yet, or no longer) where the client
# thought, because it was just created, its node is restarting or its leader moved. The
# client looks the leader up again and retries until its deadline.
_METADATA_STALE = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    }
)
# acks=all could not be met now; the same request (the same sequence) is tried again.
_REPLICATION = frozenset({"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"})
_NODE_REFIND = _METADATA_STALE | {"NOT_COORDINATOR"}
_NODE_RETRIABLE = _ALL_RETRIABLE | _METADATA_STALE | _REPLICATION


def _node(refind: frozenset[str] = _NODE_REFIND, *, quick: bool = False) -> RetryPolicy:
    """A request to a storage node: attempts may take the full request timeout, or only
    ``coordinator_timeout_ms`` when ``quick`` (a node answers offsets calls at once; one
    left unanswered that long is at a paused or cut-off leader, and is better sent again
    to whichever leader the cluster has by then than waited for)."""
    return RetryPolicy(
        idempotent=True, retriable=_NODE_RETRIABLE, refind=refind, coordinator=quick
    )


#: The one place where the retry rule of each request lives.
POLICIES: dict[Req, RetryPolicy] = {
    Req.METADATA: RetryPolicy(idempotent=True),
    Req.TOPIC: RetryPolicy(idempotent=True),
    # A second create after a lost answer would say TOPIC_ALREADY_EXISTS: not idempotent.
    # It waits for the partitions to be created on their nodes: the longer timeout.
    Req.CREATE_TOPIC: RetryPolicy(idempotent=False, coordinator=False),
    Req.ALTER_TOPIC: RetryPolicy(idempotent=True),  # a repeat sets the same values
    # A second delete after a lost answer would say UNKNOWN_TOPIC_OR_PARTITION.
    Req.DELETE_TOPIC: RetryPolicy(idempotent=False),
    Req.FIND_COORDINATOR: RetryPolicy(idempotent=True),
    # A lost answer only wastes a producer id.
    Req.INIT_PRODUCER_ID: RetryPolicy(idempotent=True),
    # A repeated init bumps the epoch once more; the client keeps whatever it gets last.
    Req.INIT_TRANSACTIONS: RetryPolicy(idempotent=True),
    Req.ADD_PARTITIONS: RetryPolicy(idempotent=True),
    Req.ADD_OFFSETS: RetryPolicy(idempotent=True),
    # The coordinator answers success to a repeat of the decision it already took.
    Req.END_TXN: RetryPolicy(idempotent=True),
    # Sequence numbers make a repeat a duplicate; the accumulator keeps the order.
    Req.PRODUCE: RetryPolicy(
        idempotent=True,
        retriable=_METADATA_STALE
        | _REPLICATION
        | {
            "KAFKA_STORAGE_ERROR",
            "COORDINATOR_NOT_AVAILABLE",
            "CONCURRENT_TRANSACTIONS",
            "COORDINATOR_LOAD_IN_PROGRESS",
        },
        refind=_METADATA_STALE,
        in_place=False,
        coordinator=False,
    ),
    Req.FETCH: _node(),
    Req.LIST_OFFSETS: _node(quick=True),
    Req.OFFSET_COMMIT: _node(quick=True),
    Req.TXN_OFFSET_COMMIT: _node(_NODE_REFIND | _ROUTING, quick=True),
    Req.OFFSET_FETCH: _node(quick=True),
    # A repeated heartbeat reports the same epoch and partitions; a repeated join names
    # the same client-made member id.
    Req.GROUP_HEARTBEAT: RetryPolicy(idempotent=True),
    Req.LIST_TRANSACTIONS: RetryPolicy(idempotent=True),
    Req.DESCRIBE_TRANSACTION: RetryPolicy(idempotent=True),
    Req.DESCRIBE_PRODUCERS: _node(),
    Req.FORCE_ABORT: RetryPolicy(idempotent=True),
    Req.LIST_ACLS: RetryPolicy(idempotent=True),
    # Creating a binding that exists is harmless, and so is deleting one that is gone
    # (though a repeat's answer then lists fewer deleted bindings).
    Req.CREATE_ACLS: RetryPolicy(idempotent=True),
    Req.DELETE_ACLS: RetryPolicy(idempotent=True),
    # Group administration. Listing reads the database of any instance; describing asks
    # the storage nodes for each partition's lag too: the longer timeout.
    Req.LIST_GROUPS: RetryPolicy(idempotent=True),
    Req.DESCRIBE_GROUP: RetryPolicy(idempotent=True, coordinator=False),
    # A delete repeated after a lost answer finds the group gone (GROUP_ID_NOT_FOUND):
    # the state asked for, which the admin client takes as done when an earlier attempt
    # may have reached the coordinator.
    Req.DELETE_GROUP: RetryPolicy(idempotent=True),
    # A repeated reset computes its target again: the same offsets for to_offset, and for
    # earliest, latest or a time what a fresh reset would set now. The group's lock orders
    # a retry behind a slow first attempt; it reads each partition's bounds on the nodes.
    Req.RESET_GROUP_OFFSETS: RetryPolicy(idempotent=True, coordinator=False),
}


class UnavailableResponse(Exception):
    """A 502/503/504 without the error envelope (a proxy or a dying server): the request
    may or may not have been applied, exactly like a lost connection."""


#: Failures after which the outcome of a request is unknown.
UNKNOWN_OUTCOME = (httpx.TransportError, UnavailableResponse)


def classify(policy: RetryPolicy, exc: BaseException) -> Verdict:
    """What to do after ``exc``, by the policy's row.

    The row decides, not the error's class: UNKNOWN_TOPIC_OR_PARTITION is no retriable
    error in the catalogue (a node cannot know whether the partition will come), but a
    request to a storage node treats it as stale metadata and retries, as Kafka does.
    """
    if isinstance(exc, UNKNOWN_OUTCOME):
        return Verdict.RETRY if policy.idempotent else Verdict.FAIL
    if isinstance(exc, EosError) and exc.code in policy.retriable:
        return Verdict.REFIND if exc.code in policy.refind else Verdict.RETRY
    return Verdict.FAIL


#: Answers after which the next attempt is worth making soon, whatever came before:
#: the owner moved (and said where), or it is loading and will serve in a moment.
_SOON = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"})


#: CONCURRENT_TRANSACTIONS attempts retried after the short backoff; later ones back off
#: as any other error does.
FAST_ATTEMPTS = 10


def backoff_s(exc: BaseException | None, attempt: int, retry: RetryConfig) -> float:
    """Exponential backoff with jitter; CONCURRENT_TRANSACTIONS gets the short one first.

    The previous transaction's markers usually land within milliseconds, so its first
    ``FAST_ATTEMPTS`` retries wait ``fast_backoff_ms``; a transaction that stays undecided
    (a node away, a marker that cannot land) then gets the ordinary growing backoff, as
    Kafka's producer does (KIP-580), instead of two hundred requests a second per client.
    No growth after a timed-out attempt (the attempt itself was the wait, and the next
    one likely goes to another instance) or after an answer that says the next attempt
    will do (``_SOON``): growing there only delays the first commit after a failover.
    """
    if isinstance(exc, EosError) and exc.code == "CONCURRENT_TRANSACTIONS":
        if attempt <= FAST_ATTEMPTS:
            return retry.fast_backoff_ms / 1000
        attempt -= FAST_ATTEMPTS
    if isinstance(exc, httpx.TimeoutException) or (
        isinstance(exc, EosError) and exc.code in _SOON
    ):
        attempt = 1
    base = min(retry.backoff_max_ms, retry.backoff_ms * 2 ** max(0, attempt - 1))
    return float(base * random.uniform(0.8, 1.2) / 1000)
