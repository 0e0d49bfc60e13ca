"""The follower's half of replication, as steps on a partition's engine: where to cut the
log when a new leader is followed, and what to do with a fetch answer.

Kept free of I/O: the node's fetcher (``partition_service.replication.fetcher``) does the
HTTP and the waiting, and the model test drives the same steps in one process.

Truncation follows KIP-101 and KIP-279. The follower asks the leader where the follower's
latest epoch ended in the leader's log. When the leader knows that epoch, the follower
cuts there (or at its own end, if shorter). When the leader answers with an older epoch
(the follower's latest never reached the leader), both logs agree at most up to the end
of that older epoch in each, so the follower cuts at the smaller of the two. Cutting at
the high watermark instead, as Kafka did before KIP-101, can lose acknowledged records or
keep a suffix the new leader never had.
"""

from __future__ import annotations

from partition_service.log.engine import PartitionEngine
from partition_service.log.epochs import UNDEFINED


def truncation_offset(engine: PartitionEngine, leader_epoch: int, leader_end: int) -> int | None:
    """Where to cut ``engine``'s log, given the leader's answer (``leader_epoch``,
    ``leader_end``) for the follower's latest epoch; None: the leader does not know the
    epoch yet (it is behind the controller), ask again later."""
    if engine.epochs.latest_epoch == UNDEFINED:
        return engine.log_end_offset  # nothing written here under any leader: nothing to cut
    if leader_epoch == UNDEFINED or leader_end == UNDEFINED:
        return None
    cut = min(leader_end, engine.log_end_offset)
    if leader_epoch < engine.epochs.latest_epoch:
        own_epoch, own_end = engine.end_offset_for(leader_epoch)
        if own_epoch != UNDEFINED:
            cut = min(cut, own_end)
    return cut


def truncate_for_leader(engine: PartitionEngine, leader_epoch: int, leader_end: int) -> int | None:
    """Cut the log for a new leader's answer; returns the new log end (None: ask again)."""
    cut = truncation_offset(engine, leader_epoch, leader_end)
    if cut is None:
        return None
    return engine.truncate_to(cut)


def apply_fetched(engine: PartitionEngine, frames: bytes, leader_high_watermark: int) -> int:
    """Append what a fetch brought and take the leader's high watermark (bounded by what
    is durable here, which ``engine.high_watermark`` does); returns the batches appended.
    The caller makes the appended frames durable (group commit) before its next fetch,
    whose offset tells the leader they are here."""
    appended = engine.append_replicated(frames) if frames else 0
    engine.replicated_offset = leader_high_watermark
    return appended
