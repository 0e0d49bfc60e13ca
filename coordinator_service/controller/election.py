"""What the controller does to one partition, given which nodes are alive (design §7).

Pure: a ``StoredPartition`` and a liveness test in, a ``Change`` (or None) out. The
controller loop (``controller.py``) reads the states, asks ``decide`` for each and writes
every change with a compare-and-set, so the rules can be tested without a database.

The rules, Kafka's:

* a dead follower leaves the ISR (an ISR shrink);
* where the leader is dead (or there is none), the first replica in ``replicas`` order
  that is in the ISR and alive becomes leader, with a new leader epoch;
* if no ISR member is alive, the partition has no leader (-1) — unless the topic allows
  an unclean election, in which case the first alive replica leads and is the ISR alone;
* an ISR is never left empty: when every member is dead, it keeps its members, so the
  first of them to come back is elected (each of them had everything committed: a batch
  is committed only once every ISR member has it, and a dead member is removed before the
  leader can go on without it);
* a partition of one replica is never touched (its only node leads, alive or not), so
  deployments from before replication behave as they did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coordinator_service.controller.partition_state import StoredPartition
from eos_protocol.replication import NO_LEADER


@dataclass(frozen=True)
class Change:
    """A new leader and ISR for a partition, and what kind of change it is."""

    leader: int
    isr: tuple[int, ...]
    removed: tuple[int, ...] = ()  # dead followers dropped from the ISR
    unclean: bool = False

    def elected(self, before: StoredPartition) -> bool:
        """A live leader where another (or none) was."""
        return self.leader != NO_LEADER and self.leader != before.leader

    def went_offline(self, before: StoredPartition) -> bool:
        return self.leader == NO_LEADER and before.leader != NO_LEADER


def decide(state: StoredPartition, alive: Callable[[int], bool]) -> Change | None:
    """The change the controller should make to ``state``, or None if it is right."""
    if not state.replicated:
        return None
    in_sync = tuple(r for r in state.isr if r in state.replicas)
    alive_isr = tuple(r for r in in_sync if alive(r))
    leader_ok = state.leader != NO_LEADER and state.leader in alive_isr
    if leader_ok:
        leader = state.leader
        isr = alive_isr
        unclean = False
    else:
        candidates = [r for r in state.replicas if r in alive_isr]
        if candidates:
            leader, isr, unclean = candidates[0], alive_isr, False
        else:
            survivors = [r for r in state.replicas if alive(r)]
            if state.unclean_leader_election and survivors:
                leader, isr, unclean = survivors[0], (survivors[0],), True
            else:
                # nobody in sync is alive: keep the ISR, wait for one of them
                leader, isr, unclean = NO_LEADER, in_sync or state.isr, False
    if leader == state.leader and isr == state.isr:
        return None
    removed = tuple(r for r in state.isr if r not in isr)
    return Change(leader=leader, isr=isr, removed=removed, unclean=unclean)


def prefer(state: StoredPartition, alive: Callable[[int], bool]) -> Change | None:
    """Leadership back to the preferred replica (the first of ``replicas``) once it is
    alive and in sync again, as Kafka's auto leader rebalance does: after a failover the
    survivors lead everything, and without this the node that came back would lead
    nothing. Only from a live leader (elections are ``decide``'s) to an in-sync replica,
    so nothing committed is lost by the move."""
    if not state.replicated or state.leader == NO_LEADER or not alive(state.leader):
        return None
    preferred = state.replicas[0]
    if preferred == state.leader or preferred not in state.isr or not alive(preferred):
        return None
    return Change(leader=preferred, isr=state.isr)
