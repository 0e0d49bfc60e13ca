"""A consumer group member's state machine (KIP-848 over HTTP), shared by both consumers
and free of I/O.

Why a core of its own: two parties drive one member. The heartbeat driver (a task of the
async consumer, a thread of the blocking one) sends what ``begin_heartbeat`` builds and
hands back each answer or error; the application's ``poll`` takes what must change
(``reconcile``), runs the rebalance callbacks and reports what it let go of or took on
(``released``, ``acquired``). Everything they share is here, under one lock, so the rules
are tested without a server and both consumers follow them alike.

::

    UNSUBSCRIBED ─subscribe─▶ JOINING ─answer─▶ STABLE ◀─┐ heartbeats: the answer's
          ▲                      ▲                │      │ assignment against owned
          │                      │ (loss handled  ├──────┘
          └──── leave ───────────┼── in poll)     │ FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID,
                                 └──── LOST ◀─────┘ or no answer for a whole session

Three sets of partitions: the ``assignment`` of the last answer (what the member may read),
``owned`` (what the application reads now: poll's positions) and their difference, which
poll settles. Owned partitions missing from the assignment are revoked: on_revoked runs
first (the application commits there), then they leave ``owned``, and the next heartbeat's
``owned_partitions`` acknowledges the revocation, after which the coordinator gives them
to another member. Until then the member still holds them, so a transaction committing
their offsets from the callback is accepted. Assigned partitions not yet owned are added,
then on_assigned runs. A fenced member lost everything: on_lost runs, nothing is owned, and
only then does it join again (with epoch 0), so the partitions it read before the loss are
never confused with those it gets back.

``group_metadata()`` is what a transaction names (KIP-447). It changes only in ``poll``
(``reconcile``), like the records: the records a poll returned were read under the
membership it gives, so a member fenced and joined again in the background cannot commit
offsets of what it read before under its new epoch.
"""

from __future__ import annotations

import enum
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from eos_protocol.common import read_answer
from eos_protocol.errors import (
    FencedMemberEpochError,
    RetriableError,
    UnknownMemberIdError,
)
from eos_protocol.groups import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    GroupHeartbeatRequest,
    GroupHeartbeatResponse,
)
from sdk._config import RetryConfig
from sdk._errors import EosTimeoutError
from sdk._transport import UNKNOWN_OUTCOME, backoff_s
from sdk._types import ConsumerGroupMetadata, TopicPartition

#: Until the first answer says otherwise (the coordinator's defaults).
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000
DEFAULT_SESSION_TIMEOUT_MS = 45_000
#: A long poll never waits longer than the protocol allows.
MAX_WAIT_MS = 60_000

Partitions = frozenset[TopicPartition]
NONE: Partitions = frozenset()


class MemberState(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"
    JOINING = "joining"  # a join (epoch 0) is due or under way
    STABLE = "stable"  # a member: heartbeats carry its id and epoch
    LOST = "lost"  # fenced: poll must drop everything before it joins again


@dataclass(frozen=True)
class Beat:
    """One heartbeat as sent: its body, and what the answer is to be read against."""

    body: dict[str, Any]
    generation: int
    sent_at: float
    owned: Partitions
    subscription_version: int

    @property
    def max_wait_ms(self) -> int:
        return int(self.body.get("max_wait_ms", 0))


@dataclass(frozen=True)
class Rebalance:
    """What poll must do now, in this order: on_lost, on_revoked, on_assigned."""

    lost: Partitions = NONE
    revoked: Partitions = NONE
    assigned: Partitions = NONE

    def __bool__(self) -> bool:
        return bool(self.lost or self.revoked or self.assigned)


def _wire(parts: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in sorted(parts)]


class GroupMember:
    """One consumer's membership of ``group_id``. Thread-safe: every method takes the lock."""

    def __init__(
        self,
        group_id: str,
        retry: RetryConfig,
        *,
        instance_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group_id = group_id
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self._retry = retry
        self._clock = clock
        self._lock = threading.RLock()
        self.state = MemberState.UNSUBSCRIBED
        self.member_id: str | None = None
        self.member_epoch = JOIN_EPOCH
        self.topics: tuple[str, ...] | None = None
        self.pattern: str | None = None
        self._subscription_version = 0  # moved by every subscribe
        self._subscription_sent = 0  # the version the coordinator has acknowledged
        self.assignment: Partitions = NONE
        self.owned: Partitions = NONE
        self._sent_owned: Partitions | None = None  # owned as the last answered beat said
        self._generation = 0  # moved by every join and leave: older answers are stale
        self.interval_ms = DEFAULT_HEARTBEAT_INTERVAL_MS
        self.session_ms = DEFAULT_SESSION_TIMEOUT_MS
        self._last_sent_at: float | None = None
        self._last_answer_at: float | None = None
        self._early = False  # the last answer came back early and told nothing new
        self._failures = 0
        self._retry_at: float | None = None
        self._error: BaseException | None = None  # for the application (raised by poll)
        self._metadata = ConsumerGroupMetadata(group_id, instance_id=instance_id)

    @property
    def static(self) -> bool:
        return self.instance_id is not None

    @property
    def subscribed(self) -> bool:
        with self._lock:
            return self.state is not MemberState.UNSUBSCRIBED

    # --- the application's side ----------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None, pattern: str | None) -> None:
        """Read ``topics`` (or every topic whose whole name matches ``pattern``); a
        subscription changed while a member is sent with its next heartbeat."""
        names = None if topics is None else tuple(sorted(set(topics)))
        if (names is None) == (pattern is None):
            raise ValueError("subscribe takes topics or a pattern (one of the two)")
        if names is not None and not names:
            raise ValueError("subscribe needs at least one topic (unsubscribe to stop)")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} does not compile: {exc}") from None
        try:  # the contract's limits (names, lengths), checked before anything is sent
            GroupHeartbeatRequest(member_epoch=JOIN_EPOCH, subscribed_topic_names=(
                None if names is None else list(names)), subscribed_topic_regex=pattern)
        except ValidationError as exc:
            raise ValueError(f"not a valid subscription: {exc}") from None
        with self._lock:
            self.topics, self.pattern = names, pattern
            self._subscription_version += 1
            if self.state is MemberState.UNSUBSCRIBED:
                self._start_join()

    def reconcile(self) -> Rebalance:
        """What poll must do now; the metadata becomes that of the membership its records
        are read under. A member that got no answer for a whole session is lost: the
        coordinator has removed it."""
        with self._lock:
            plan = self._plan()
            if self.state is not MemberState.LOST:
                self._metadata = self._current_metadata()
            return plan

    def has_work(self) -> bool:
        """Whether ``reconcile`` would ask for anything, or an error waits for poll."""
        with self._lock:
            return self._error is not None or bool(self._plan())

    def released(self, parts: Iterable[TopicPartition]) -> None:
        """The application let go of ``parts`` (its callback ran): the next heartbeat says
        so. A lost member with nothing left joins again."""
        with self._lock:
            self.owned = self.owned - frozenset(parts)
            if self.state is MemberState.LOST and not self.owned:
                self._metadata = ConsumerGroupMetadata(self.group_id, instance_id=self.instance_id)
                self._start_join()

    def acquired(self, parts: Iterable[TopicPartition]) -> None:
        with self._lock:
            self.owned = self.owned | frozenset(parts)

    def release_all(self) -> Rebalance:
        """Before a leave: everything owned is lost (a fenced member, or one whose session
        is over: committing in on_revoked would write offsets that are no longer its
        own) or revoked."""
        with self._lock:
            self._plan()
            if self.state is MemberState.LOST:
                return Rebalance(lost=self.owned)
            return Rebalance(revoked=self.owned)

    def leave(self) -> dict[str, Any] | None:
        """Stop being a member; the leave heartbeat's body (-2 for a static member, whose
        partitions then wait for it until its session ends), or None when the coordinator
        has no member to remove."""
        with self._lock:
            body = None
            if self.state is MemberState.STABLE and self.member_id is not None:
                epoch = STATIC_LEAVE_EPOCH if self.static else LEAVE_EPOCH
                body = {"member_id": self.member_id, "member_epoch": epoch}
            self.state = MemberState.UNSUBSCRIBED
            self._generation += 1
            self.member_id, self.member_epoch = None, JOIN_EPOCH
            self.topics = self.pattern = None
            self.assignment = self.owned = NONE
            self._error = None
            self._metadata = ConsumerGroupMetadata(self.group_id, instance_id=self.instance_id)
            return body

    def group_metadata(self) -> ConsumerGroupMetadata:
        with self._lock:
            return self._metadata

    def take_error(self) -> BaseException | None:
        """A refusal the application must hear of (an unknown topic, a bad pattern, an
        instance id in use, a full group): raised once by poll; the heartbeats go on."""
        with self._lock:
            error, self._error = self._error, None
            return error

    # --- the heartbeat driver's side -----------------------------------------------------

    def next_heartbeat(self) -> float | None:
        """Seconds until the next heartbeat is due (0: now); None while none is (no
        subscription, or a loss poll has not handled yet): wait to be woken."""
        with self._lock:
            now = self._clock()
            if self.state in (MemberState.UNSUBSCRIBED, MemberState.LOST):
                return None
            if self._retry_at is not None and now < self._retry_at:
                return self._retry_at - now
            if self.state is MemberState.JOINING or self._last_sent_at is None:
                return 0.0
            if self.owned != self._sent_owned or self._subscription_dirty:
                return 0.0  # an acknowledgement or a new subscription: at once
            if self.owned == self.assignment and not self._early:
                return 0.0  # in step: the next long poll
            return max(0.0, self._last_sent_at + self.interval_ms / 1000 - now)

    def begin_heartbeat(self) -> Beat | None:
        """The heartbeat to send now: a join, or the member's id, epoch and owned
        partitions, held by the coordinator (``max_wait_ms``) while nothing changes."""
        with self._lock:
            if self.state in (MemberState.UNSUBSCRIBED, MemberState.LOST):
                return None
            now = self._clock()
            joining = self.state is MemberState.JOINING
            fields: dict[str, Any] = {
                "member_id": self.member_id,
                "member_epoch": JOIN_EPOCH if joining else self.member_epoch,
                "owned_partitions": [] if joining else _wire(self.owned),
            }
            if joining:
                fields.update(instance_id=self.instance_id,
                              rebalance_timeout_ms=self.rebalance_timeout_ms)  # fmt: skip
            if joining or self._subscription_dirty:
                if self.pattern is not None:
                    fields["subscribed_topic_regex"] = self.pattern
                else:
                    fields["subscribed_topic_names"] = list(self.topics or ())
            elif self.owned == self.assignment:
                fields["max_wait_ms"] = min(self.interval_ms, self.session_ms // 2, MAX_WAIT_MS)
            request = GroupHeartbeatRequest.model_validate(fields)
            body = request.model_dump(mode="json", exclude_none=True)
            self._last_sent_at = now
            return Beat(body, self._generation, now, self.owned, self._subscription_version)

    def on_answer(self, beat: Beat, body: Any) -> bool:
        """Take in a heartbeat's answer; True when poll has something to do now."""
        answer = read_answer(GroupHeartbeatResponse, body)
        with self._lock:
            if beat.generation != self._generation or self.state not in (
                MemberState.JOINING, MemberState.STABLE
            ):
                return False  # an answer to a member that left or was fenced since
            now = self._clock()
            assignment = frozenset(TopicPartition(tp.topic, tp.partition)
                                   for tp in answer.assignment)  # fmt: skip
            news = assignment != self.assignment or answer.member_epoch != self.member_epoch
            self.member_id, self.member_epoch = answer.member_id, answer.member_epoch
            self.interval_ms = max(1, answer.heartbeat_interval_ms)
            self.session_ms = max(1, answer.session_timeout_ms)
            self.assignment = assignment
            self.state = MemberState.STABLE
            self._sent_owned = beat.owned
            self._subscription_sent = max(self._subscription_sent, beat.subscription_version)
            self._last_answer_at = now
            self._failures, self._retry_at = 0, None
            self._early = not news and now - beat.sent_at < beat.max_wait_ms / 2000
            return self.owned != self.assignment

    def fenced(self) -> None:
        """The coordinator refused one of this member's calls as fenced (a commit): as a
        heartbeat's fencing, everything owned is lost."""
        with self._lock:
            if self.state in (MemberState.JOINING, MemberState.STABLE):
                self._lose()

    def on_error(self, beat: Beat, exc: BaseException) -> bool:
        """A heartbeat failed (after the transport's own retries). Fencing loses every
        partition; a transient failure is tried again after a backoff while the session
        may last; any other refusal is kept for poll to raise, and tried again later.
        True when poll has something to do now."""
        with self._lock:
            if beat.generation != self._generation or self.state not in (
                MemberState.JOINING, MemberState.STABLE
            ):
                return False
            now = self._clock()
            if isinstance(exc, FencedMemberEpochError | UnknownMemberIdError):
                self._lose()
                return True
            self._failures += 1
            if isinstance(exc, (RetriableError, EosTimeoutError, *UNKNOWN_OUTCOME)):
                self._retry_at = now + backoff_s(exc, self._failures, self._retry)
                if self.state is MemberState.STABLE and self._session_over(now):
                    self._lose()
                    return True
                return False
            self._error = exc
            self._retry_at = now + self._retry.backoff_max_ms / 1000
            return True

    def call_timeout_s(self) -> float:
        """How long the transport may retry one heartbeat in place (a NOT_COORDINATOR
        followed, a coordinator restarting) before the member decides what next."""
        with self._lock:
            return max(1.0, self.interval_ms / 1000)

    # --- inside the lock -----------------------------------------------------------------

    @property
    def _subscription_dirty(self) -> bool:
        return self._subscription_sent < self._subscription_version

    def _plan(self) -> Rebalance:
        if self.state is MemberState.STABLE and self._session_over(self._clock()):
            self._lose()
        if self.state is MemberState.LOST:
            return Rebalance(lost=self.owned)
        if self.state is not MemberState.STABLE:
            return Rebalance()
        return Rebalance(
            revoked=self.owned - self.assignment, assigned=self.assignment - self.owned
        )

    def _session_over(self, now: float) -> bool:
        """Whether the coordinator has certainly given up on this member: no answer for
        a whole session (its deadline ran from a moment before the last answer came)."""
        return self._last_answer_at is not None and (
            now - self._last_answer_at > self.session_ms / 1000
        )

    def _start_join(self) -> None:
        self.state = MemberState.JOINING
        self._generation += 1
        if not self.static or self.member_id is None:
            # a fresh member with an id of its own making (KIP-848): a join repeated after
            # a lost answer names the same member instead of leaving an orphan behind
            self.member_id = uuid.uuid4().hex
        self.member_epoch = JOIN_EPOCH
        self.assignment = NONE
        self._sent_owned = None
        self._last_sent_at = self._last_answer_at = None
        self._failures, self._retry_at, self._early = 0, None, False

    def _lose(self) -> None:
        """Fenced: nothing is the member's any more. With nothing owned it joins again at
        once; otherwise poll must first drop everything (on_lost)."""
        if self.owned:
            self.state = MemberState.LOST
            self._generation += 1
            self.assignment = NONE
        else:
            self._metadata = ConsumerGroupMetadata(self.group_id, instance_id=self.instance_id)
            self._start_join()

    def _current_metadata(self) -> ConsumerGroupMetadata:
        if self.state is MemberState.STABLE and self.member_id is not None:
            return ConsumerGroupMetadata(
                self.group_id, self.member_id, self.member_epoch, self.instance_id
            )
        return ConsumerGroupMetadata(self.group_id, instance_id=self.instance_id)


__all__ = ["Beat", "GroupMember", "MemberState", "Rebalance"]
