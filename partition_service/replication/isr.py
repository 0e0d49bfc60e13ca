"""What the leader of a partition knows of its followers: how far each has copied, which
are in sync, and from that the high watermark.

Kafka's rules (``Partition.scala``, ``Replica.scala``), kept free of I/O so that the model
test can drive them step by step:

* a follower's log end offset is the offset of its latest fetch: it asks for what it does
  not have yet, so everything below is on its disk;
* a follower is caught up when a fetch asked for the leader's log end as it was then, or
  for the log end the leader had at the follower's previous fetch (so a follower that keeps
  up with a busy leader counts as caught up although the end moves between its fetches);
* a follower whose fetch waits at the leader's log end for more (a long poll) has all
  there is: it is caught up for as long as it waits, so an idle partition's followers
  may poll seldom (``replica_fetch_wait_max_ms``) without ever counting as lagging;
* an ISR member that has not been caught up for ``lag_time_ms`` is proposed for removal;
  a follower outside the ISR whose log end reached the high watermark, and the start of the
  leader's epoch, is proposed for addition once it is caught up by the same rule (the
  controller decides; ``docs/design.md`` 7) — on an idle partition a follower removed for
  lag still holds everything up to the high watermark, and without the second condition it
  would be proposed back at once, the ISR flapping for as long as it stays cut off;
* the high watermark is the smallest log end in the ISR, the leader's own counted only as
  far as its fsync has reached, and it never moves back while this replica leads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class FollowerProgress:
    """One follower as the leader sees it."""

    log_end_offset: int = 0
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = 0
    waiting_fetches: int = 0  # its fetches parked at the leader's log end now


@dataclass
class LeaderReplicas:
    """The follower bookkeeping of a partition led here in ``leader_epoch``."""

    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: list[int]
    isr: list[int]
    min_insync_replicas: int
    epoch_start_offset: int  # where this leader's epoch began in its log
    lag_time_ms: int
    now_ms: int  # when this replica became leader: followers start "caught up" then
    high_watermark: int = 0
    followers: dict[int, FollowerProgress] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for replica in self.replicas:
            if replica != self.leader:
                self.followers[replica] = FollowerProgress(last_caught_up_ms=self.now_ms)

    # -- what followers tell the leader --------------------------------------------------
    def on_fetch(self, replica: int, fetch_offset: int, leader_end: int, now_ms: int) -> None:
        """A follower fetched from ``fetch_offset`` while the leader's log ended at
        ``leader_end``."""
        progress = self.followers.get(replica)
        if progress is None:
            return  # not a replica of this partition (the caller refuses the fetch)
        if fetch_offset >= leader_end:
            progress.last_caught_up_ms = now_ms
        elif fetch_offset >= progress.leader_end_at_last_fetch:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.log_end_offset = fetch_offset
        progress.last_fetch_ms = now_ms
        progress.leader_end_at_last_fetch = leader_end

    def on_wait(self, replica: int, waiting: bool, now_ms: int) -> None:
        """A fetch of ``replica`` starts (``waiting``) or stops waiting at the leader's log
        end. Either way the follower had everything until ``now_ms``."""
        progress = self.followers.get(replica)
        if progress is None:
            return
        progress.waiting_fetches = max(progress.waiting_fetches + (1 if waiting else -1), 0)
        progress.last_caught_up_ms = max(progress.last_caught_up_ms, now_ms)

    # -- the high watermark --------------------------------------------------------------
    def advance_high_watermark(self, leader_durable: int) -> int:
        """The smallest log end among the ISR, never below the last one; returns it."""
        ends = [leader_durable]
        ends += [self.followers[r].log_end_offset for r in self.isr if r in self.followers]
        self.high_watermark = max(self.high_watermark, min(ends))
        return self.high_watermark

    def enough_in_sync(self) -> bool:
        return len(self.isr) >= self.min_insync_replicas

    # -- ISR proposals -------------------------------------------------------------------
    def caught_up(self, replica: int, now_ms: int) -> bool:
        """Whether ``replica`` waits at the log end now or was caught up within the lag
        time."""
        progress = self.followers[replica]
        return (
            progress.waiting_fetches > 0
            or now_ms - progress.last_caught_up_ms <= self.lag_time_ms
        )

    def lagging(self, now_ms: int) -> list[int]:
        """ISR followers not caught up within the lag time."""
        return [r for r in self.isr if r in self.followers and not self.caught_up(r, now_ms)]

    def ready_to_join(self, now_ms: int) -> list[int]:
        """Followers outside the ISR that are caught up and have everything up to the high
        watermark and the start of this leader's epoch (so they hold no suffix of an older
        leader)."""
        floor = max(self.high_watermark, self.epoch_start_offset)
        return [
            r
            for r, progress in self.followers.items()
            if r not in self.isr
            and progress.log_end_offset >= floor
            and self.caught_up(r, now_ms)
        ]

    def proposed_isr(self, now_ms: int) -> list[int] | None:
        """The ISR the controller should be asked for now, or None if it is right."""
        lagging = set(self.lagging(now_ms))
        joining = self.ready_to_join(now_ms)
        if not lagging and not joining:
            return None
        proposal = [r for r in self.isr if r not in lagging] + joining
        return _in_replica_order(proposal, self.replicas)

    def accept_state(
        self, isr: Iterable[int], partition_epoch: int, min_insync_replicas: int
    ) -> None:
        """The controller's answer (or a later heartbeat) for this leader epoch."""
        self.isr = _in_replica_order(isr, self.replicas)
        self.partition_epoch = partition_epoch
        self.min_insync_replicas = min_insync_replicas


def _in_replica_order(members: Iterable[int], replicas: list[int]) -> list[int]:
    chosen = set(members)
    return [r for r in replicas if r in chosen]
