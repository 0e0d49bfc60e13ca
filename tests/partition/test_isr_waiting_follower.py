"""A follower whose fetch waits at the leader's log end is in sync however long it waits.

Followers of an idle partition poll with a long wait (``replica_fetch_wait_max_ms``): the
leader must not take such a wait for lag, yet must still see a follower that stopped
asking (``LeaderReplicas.lagging``).
"""

from __future__ import annotations

import pytest

from partition_service.replication.isr import LeaderReplicas

pytestmark = pytest.mark.unit

LAG_MS = 1_000


def _leader() -> LeaderReplicas:
    return LeaderReplicas(
        leader=1, leader_epoch=0, partition_epoch=0, replicas=[1, 2, 3], isr=[1, 2, 3],
        min_insync_replicas=2, epoch_start_offset=0, lag_time_ms=LAG_MS, now_ms=0,
    )  # fmt: skip


def test_a_follower_waiting_at_the_log_end_never_lags() -> None:
    leader = _leader()
    leader.on_fetch(2, 0, 0, now_ms=100)
    leader.on_wait(2, True, now_ms=100)
    leader.on_fetch(3, 0, 0, now_ms=100)
    # node 3 stops asking; node 2 keeps waiting far past the lag time
    assert leader.lagging(now_ms=100 + 5 * LAG_MS) == [3]


def test_the_lag_time_counts_from_the_end_of_the_wait() -> None:
    leader = _leader()
    leader.on_wait(2, True, now_ms=100)
    leader.on_wait(2, False, now_ms=4_000)  # the wait ended: caught up until then
    assert 2 not in leader.lagging(now_ms=4_000 + LAG_MS)
    assert 2 in leader.lagging(now_ms=4_001 + LAG_MS)


def test_an_overlapping_retry_keeps_the_follower_waiting() -> None:
    """A follower that gave up on a fetch and asked again has two waits for a moment; the
    first one ending must not undo the second."""
    leader = _leader()
    leader.on_wait(2, True, now_ms=100)
    leader.on_wait(2, True, now_ms=200)
    leader.on_wait(2, False, now_ms=300)
    assert 2 not in leader.lagging(now_ms=300 + 10 * LAG_MS)
    leader.on_wait(2, False, now_ms=400)
    assert 2 in leader.lagging(now_ms=401 + LAG_MS)


def test_an_unknown_replica_changes_nothing() -> None:
    leader = _leader()
    leader.on_wait(9, True, now_ms=100)
    assert 9 not in leader.followers


def test_followers_cut_off_one_after_the_other_both_leave_and_stay_out() -> None:
    """On an idle partition a follower removed for lag still holds everything up to the
    high watermark; it must not be proposed back until it fetches again, or two followers
    that lag out one round apart swap places in the ISR for as long as they are cut off."""
    leader = _leader()
    leader.on_fetch(2, 0, 0, now_ms=0)
    leader.on_fetch(3, 0, 0, now_ms=300)  # both hold everything; then neither asks again
    now = LAG_MS + 100
    assert leader.proposed_isr(now) == [1, 3]  # node 2 lagged out first
    leader.accept_state([1, 3], partition_epoch=1, min_insync_replicas=2)
    now = LAG_MS + 400
    assert leader.proposed_isr(now) == [1]  # node 3 too, and node 2 is not back
    leader.accept_state([1], partition_epoch=2, min_insync_replicas=2)
    assert leader.proposed_isr(now + 10 * LAG_MS) is None
    leader.on_fetch(2, 0, 0, now_ms=now + 10 * LAG_MS)  # node 2 asks again, caught up
    assert leader.proposed_isr(now + 10 * LAG_MS) == [1, 2]
