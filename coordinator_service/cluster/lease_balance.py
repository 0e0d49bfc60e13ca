"""How many transaction-log partitions each coordinator instance should own, and what one
instance does about it in a lease round: the rule alone, with no I/O.

Leases alone only say who may write a partition; left to themselves they are taken
greedily, so the first instance to start owns every partition and a second one, however
many cores it brings, only waits for the first to die. So every instance, in each lease
round, reads the same picture (which instances are alive, who holds which lease) and
works out its fair share: with ``P`` partitions and ``n`` live instances sorted by id,
instance ``i`` should own ``P // n`` partitions, one more when ``i < P % n``. The shares
add up to ``P`` exactly and differ by at most one (Kafka's range assignor, applied to
the coordinators themselves).

From its share an instance decides two things, each from its own picture:

* **take**: free partitions (never leased, released, or expired) up to its share; and
  free partitions nobody else is short of — an instance that died leaves partitions
  that the survivors' shares may not cover yet while its heartbeat is still fresh, and
  those must not wait for it to age out;
* **give**: partitions above its share, as many as the other live instances are short
  of after the free partitions are counted, so a partition is only handed over when
  someone is there to take it.

An instance counts as alive when its heartbeat is younger than half the lease time (a
healthy instance beats every third of it) or when it holds a lease that has not run out.
A killed instance therefore drops out of the picture by the time its leases expire, and
the survivors' shares grow to cover its partitions at once.

Instances whose pictures differ for a moment (a heartbeat written between two reads)
may briefly disagree; each round starts from the database again, so they converge
without any instance having to agree with another first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseRow:
    """One lease as a round reads it."""

    log_partition: int
    owner: str | None
    live: bool  # held and not run out


@dataclass(frozen=True)
class LeasePicture:
    """What one round of one instance sees."""

    me: str
    partitions: int
    rows: tuple[LeaseRow, ...]
    beating: frozenset[str]  # instances whose heartbeat is recent

    def live_instances(self) -> list[str]:
        """Every instance taken to be alive, this one always included, in the order the
        shares are dealt (by id, the same order for every instance)."""
        holders = {row.owner for row in self.rows if row.live and row.owner is not None}
        return sorted(self.beating | holders | {self.me})

    def held_by(self) -> dict[str, list[int]]:
        held: dict[str, list[int]] = {}
        for row in self.rows:
            if row.live and row.owner is not None:
                held.setdefault(row.owner, []).append(row.log_partition)
        return held

    def free(self) -> list[int]:
        return sorted(row.log_partition for row in self.rows if not row.live)


def fair_shares(instances: Iterable[str], partitions: int) -> dict[str, int]:
    """Each instance's share of ``partitions``: equal, the first ``partitions % n`` (by
    id) one more."""
    ordered = sorted(set(instances))
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(ordered)}


@dataclass(frozen=True)
class RoundPlan:
    """What this instance does in this round."""

    share: int
    take: int  # how many free partitions to try to take (lowest numbers first)
    give: tuple[int, ...]  # partitions to hand over (released after a graceful unload)
    imbalanced: bool  # someone is short or over: look again soon

    @property
    def idle(self) -> bool:
        return self.take == 0 and not self.give


def plan_round(picture: LeasePicture, owned: Mapping[int, int]) -> RoundPlan:
    """This instance's part in reaching the fair shares, from ``picture`` and the
    partitions it knows it owns (``owned``: partition -> coordinator epoch)."""
    shares = fair_shares(picture.live_instances(), picture.partitions)
    held = picture.held_by()
    mine = len(owned)
    share = shares[picture.me]
    free = picture.free()
    short_me = max(0, share - mine)
    short_others = sum(
        max(0, want - len(held.get(name, ()))) for name, want in shares.items()
        if name != picture.me
    )
    # Free partitions beyond what everyone is short of would otherwise stay unowned.
    unclaimed = max(0, len(free) - short_me - short_others)
    take = min(len(free), short_me + unclaimed)
    give: tuple[int, ...] = ()
    surplus = mine - share
    if surplus > 0:
        wanted = max(0, short_others - len(free))
        give = tuple(sorted(owned, reverse=True)[: min(surplus, wanted)])
    over_others = any(
        len(held.get(name, ())) > want for name, want in shares.items() if name != picture.me
    )
    imbalanced = (short_me > 0 and over_others) or bool(give) or take > 0
    return RoundPlan(share=share, take=take, give=give, imbalanced=imbalanced)
