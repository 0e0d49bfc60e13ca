"""What a member's subscription means now: names and patterns resolved against the topics.

A subscription is a list of topic names or one regular expression. Names must exist when
the member subscribes (a typo should fail at once, not read nothing for ever); a pattern
may match nothing yet and picks up topics created later. Internal topics (``__`` first)
never match a pattern, as in Kafka.

The group's targets are computed for a snapshot ``{topic: partition count}`` of what its
members subscribe to; when that snapshot changes (a matching topic created, partitions
added) the group epoch moves and the targets are computed again. Resolving runs on every
heartbeat, so it is memoised on the metadata cache's object (replaced on every change)
and on the group epoch (moved on every change of membership or subscription).
"""

from __future__ import annotations

import re

from coordinator_service.controller.metadata import Metadata
from coordinator_service.groups.membership import Group, Member
from eos_protocol.errors import (
    InvalidRegularExpressionError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.groups import JOIN_EPOCH, GroupHeartbeatRequest

INTERNAL_PREFIX = "__"


def compile_pattern(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidRegularExpressionError(
            f"subscribed_topic_regex {pattern!r} does not compile: {exc}"
        ) from None


class SubscriptionResolver:
    """Members' subscriptions against the coordinator's cached topics."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._matches: dict[str, tuple[object, frozenset[str]]] = {}
        self._group_memo: dict[str, tuple[object, int]] = {}

    def counts(self) -> dict[str, int]:
        return self._metadata.topic_partition_counts()

    async def refresh(self) -> None:
        await self._metadata.refresh()

    def _matching(self, pattern: str) -> frozenset[str]:
        counts = self.counts()
        memo = self._matches.get(pattern)
        if memo is not None and memo[0] is counts:
            return memo[1]
        compiled = self._patterns.get(pattern)
        if compiled is None:
            compiled = self._patterns[pattern] = compile_pattern(pattern)
        found = frozenset(
            name for name in counts
            if not name.startswith(INTERNAL_PREFIX) and compiled.fullmatch(name)
        )
        self._matches[pattern] = (counts, found)
        return found

    def topics_of(self, member: Member) -> frozenset[str]:
        """The existing topics ``member`` subscribes to."""
        if member.subscribed_topic_regex is not None:
            return self._matching(member.subscribed_topic_regex)
        counts = self.counts()
        return frozenset(t for t in member.subscribed_topic_names if t in counts)

    def refresh_group(self, group: Group) -> bool:
        """Bring ``group.subscribed_metadata`` up to date; True when it changed."""
        counts = self.counts()
        memo = self._group_memo.get(group.group_id)
        if memo is not None and memo[0] is counts and memo[1] == group.group_epoch:
            return False
        topics: set[str] = set()
        seen_patterns: set[str] = set()
        for member in group.members.values():
            if member.subscribed_topic_regex is not None:
                if member.subscribed_topic_regex not in seen_patterns:
                    seen_patterns.add(member.subscribed_topic_regex)
                    topics |= self._matching(member.subscribed_topic_regex)
            else:
                topics.update(t for t in member.subscribed_topic_names if t in counts)
        snapshot = {t: counts[t] for t in sorted(topics)}
        changed = snapshot != group.subscribed_metadata
        group.subscribed_metadata = snapshot
        self._group_memo[group.group_id] = (counts, group.group_epoch + (1 if changed else 0))
        return changed

    def forget(self, group_id: str) -> None:
        self._group_memo.pop(group_id, None)


async def check_subscription(resolver: SubscriptionResolver, req: GroupHeartbeatRequest) -> None:
    """Refuse a subscription no group could use, before anything changes."""
    if req.subscribed_topic_names is not None and req.subscribed_topic_regex is not None:
        raise InvalidRequestError(
            "subscribe by subscribed_topic_names or by subscribed_topic_regex, not both"
        )
    if req.member_epoch == JOIN_EPOCH and (
        req.subscribed_topic_names is None and req.subscribed_topic_regex is None
    ):
        raise InvalidRequestError(
            "a join (member_epoch 0) names subscribed_topic_names or subscribed_topic_regex"
        )
    if req.subscribed_topic_regex is not None:
        compile_pattern(req.subscribed_topic_regex)
    if req.subscribed_topic_names:
        missing = [t for t in req.subscribed_topic_names if t not in resolver.counts()]
        if missing:
            await resolver.refresh()  # created on another instance just now?
            missing = [t for t in missing if t not in resolver.counts()]
        if missing:
            shown = ", ".join(repr(t) for t in sorted(missing)[:5])
            raise UnknownTopicOrPartitionError(
                f"cannot subscribe to {shown}: no such topic"
                + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            )
