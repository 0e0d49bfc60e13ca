"""Deciding whether a principal may perform an operation on a resource (Kafka's rules).

A binding matches a request when its principal is the caller or ``User:*``, its resource
type is the request's and its pattern names the resource (a literal name, ``*`` for every
name, or a prefix). A matching DENY refuses whatever any ALLOW says. ``all`` covers every
operation, and an ALLOW of ``read``, ``write`` or ``alter`` also allows ``describe`` (you
may see what you may use). With no matching ALLOW the answer is no; super users are
allowed everything without bindings.

Decisions are cached per (principal, resource, name, operation) until the rules change,
so the produce and fetch paths pay a dictionary lookup, not a scan of the rules.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from eos_protocol.acl import (
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

MAX_CACHED_DECISIONS = 100_000
IMPLIES_DESCRIBE = frozenset(
    {Operation.READ, Operation.WRITE, Operation.ALTER, Operation.DELETE}
)

DecisionKey = tuple[str, ResourceType, str, Operation]


def _names(binding: AclBinding, name: str) -> bool:
    if binding.pattern_type is PatternType.PREFIXED:
        return name.startswith(binding.resource_name)
    return binding.resource_name in (WILDCARD, name)


def _allows(binding: AclBinding, operation: Operation) -> bool:
    if binding.operation in (operation, Operation.ALL):
        return True
    return operation is Operation.DESCRIBE and binding.operation in IMPLIES_DESCRIBE


def _denies(binding: AclBinding, operation: Operation) -> bool:
    return binding.operation in (operation, Operation.ALL)


class Authorizer:
    """The current rules and super users, and the decisions taken from them."""

    def __init__(self, super_users: Iterable[str] = ()) -> None:
        self.super_users = frozenset(super_users)
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        self._cache: dict[DecisionKey, bool] = {}
        self.loaded = False
        self.loaded_at = 0.0  # time.monotonic() when the rules in force began to be read
        self.bindings: list[AclBinding] = []

    def replace(
        self,
        bindings: Iterable[AclBinding],
        super_users: Iterable[str] | None = None,
        *,
        as_of: float | None = None,
    ) -> None:
        """Swap in a new rule set (the decisions cached so far are dropped). ``as_of`` is
        the ``time.monotonic()`` at which their read began: they hold every change made
        before it, which is what a denial needs to know (``AccessControl``)."""
        by_type: dict[ResourceType, list[AclBinding]] = {}
        kept = list(bindings)
        for binding in kept:
            by_type.setdefault(binding.resource_type, []).append(binding)
        self._by_type = by_type
        self.bindings = kept
        if super_users is not None:
            self.super_users = frozenset(super_users)
        self._cache = {}
        self.loaded = True
        self.loaded_at = time.monotonic() if as_of is None else as_of

    def _matching(self, principal: str, rtype: ResourceType, name: str) -> list[AclBinding]:
        return [
            b
            for b in self._by_type.get(rtype, ())
            if b.principal in (principal, "User:" + WILDCARD) and _names(b, name)
        ]

    def allowed(self, principal: str, rtype: ResourceType, name: str, op: Operation) -> bool:
        key = (principal, rtype, name, op)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(principal, rtype, name, op)
            if len(self._cache) >= MAX_CACHED_DECISIONS:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def _decide(self, principal: str, rtype: ResourceType, name: str, op: Operation) -> bool:
        if principal in self.super_users:
            return True
        matching = self._matching(principal, rtype, name)
        if any(b.permission is Permission.DENY and _denies(b, op) for b in matching):
            return False
        return any(b.permission is Permission.ALLOW and _allows(b, op) for b in matching)

    def allowed_somewhere(self, principal: str, rtype: ResourceType, op: Operation) -> bool:
        """Whether some resource of ``rtype`` allows ``op`` (Kafka's KIP-679 test for an
        idempotent producer: write on any topic). Each ALLOW binding is tried on the name
        its pattern gives, so a DENY covering exactly that name still wins."""
        if principal in self.super_users:
            return True
        for binding in self._by_type.get(rtype, ()):
            if (
                binding.permission is Permission.ALLOW
                and binding.principal in (principal, "User:" + WILDCARD)
                and _allows(binding, op)
                and self.allowed(principal, rtype, binding.resource_name, op)
            ):
                return True
        return False
