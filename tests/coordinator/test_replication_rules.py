"""The controller's rules without a database: placement, the election decision, the
checks of AlterPartition and of a topic's replication settings (docs/design.md §7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator_service.controller.election import decide, prefer
from coordinator_service.controller.metadata import TopicReplication
from coordinator_service.controller.partition_state import (
    Liveness,
    StoredPartition,
    decode_ids,
    place_replicas,
)
from coordinator_service.controller.replication import check_isr
from eos_protocol.errors import InvalidRequestError

pytestmark = pytest.mark.unit


def state(
    leader: int, replicas: tuple[int, ...], isr: tuple[int, ...], *, unclean: bool = False,
    epoch: int = 0,
) -> StoredPartition:
    return StoredPartition(
        topic="t", partition=0, leader=leader, leader_epoch=epoch, partition_epoch=epoch,
        replicas=replicas, isr=isr, replication_factor=len(replicas),
        min_insync_replicas=min(2, len(replicas)), unclean_leader_election=unclean,
    )


def alive(*nodes: int) -> Callable[[int], bool]:
    return lambda node: node in nodes


# --- placement ---------------------------------------------------------------------------


def test_replicas_are_distinct_nodes_round_robin_and_the_first_leads() -> None:
    nodes = [1, 2, 3, 4]
    placement = place_replicas("orders", 8, nodes, 3)
    assert len(placement) == 8
    for i, replicas in enumerate(placement):
        assert len(set(replicas)) == 3
        # partition i on start+i, start+i+1, start+i+2
        first = nodes.index(replicas[0])
        assert list(replicas) == [nodes[(first + j) % 4] for j in range(3)]
        assert nodes.index(placement[(i + 1) % 8][0]) == (first + 1) % 4
    leaders = [r[0] for r in placement]
    assert sorted(leaders) == sorted(nodes * 2)  # leaders spread evenly


def test_one_replica_is_the_placement_from_before_replication() -> None:
    import zlib

    nodes = [1, 2, 3]
    start = zlib.crc32(b"orders") % 3
    old = [nodes[(start + i) % 3] for i in range(5)]
    assert [r for (r,) in place_replicas("orders", 5, nodes, 1)] == old


# --- elections ---------------------------------------------------------------------------


def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_in_replica_order() -> None:
    before = state(1, (1, 2, 3), (3, 1, 2))
    change = decide(before, alive(2, 3))
    assert change is not None
    assert change.leader == 2  # replicas order, not ISR order
    assert set(change.isr) == {2, 3}
    assert change.removed == (1,)
    assert change.elected(before)
    after = before.changed(change.leader, change.isr)
    assert (after.leader_epoch, after.partition_epoch) == (1, 1)


def test_a_dead_follower_leaves_the_isr_and_the_leader_epoch_stays() -> None:
    before = state(1, (1, 2, 3), (1, 2, 3))
    change = decide(before, alive(1, 3))
    assert change is not None
    assert (change.leader, change.isr, change.removed) == (1, (1, 3), (2,))
    assert not change.elected(before)
    after = before.changed(change.leader, change.isr)
    assert (after.leader_epoch, after.partition_epoch) == (0, 1)


def test_nothing_changes_while_everyone_in_sync_is_alive() -> None:
    assert decide(state(1, (1, 2, 3), (1, 2)), alive(1, 2, 3)) is None
    assert decide(state(1, (1, 2, 3), (1, 2)), alive(1, 2)) is None


def test_no_live_isr_member_leaves_the_partition_leaderless_with_its_isr() -> None:
    before = state(1, (1, 2), (1,))
    change = decide(before, alive(2))  # 2 is alive but not in sync
    assert change is not None
    assert (change.leader, change.isr) == (-1, (1,))
    assert change.went_offline(before)
    after = before.changed(change.leader, change.isr)
    assert after.leader_epoch == 1
    assert decide(after, alive(2)) is None  # stays so
    back = decide(after, alive(1, 2))  # the ISR member returns: it leads again
    assert back is not None
    assert (back.leader, back.isr) == (1, (1,))
    assert back.elected(after)


def test_an_isr_whose_members_all_died_together_keeps_them_and_the_first_back_leads() -> None:
    before = state(1, (1, 2, 3), (1, 2))
    change = decide(before, alive(3))
    assert change is not None
    assert (change.leader, change.isr) == (-1, (1, 2))
    after = before.changed(change.leader, change.isr)
    back = decide(after, alive(2, 3))
    assert back is not None
    assert (back.leader, back.isr) == (2, (2,))


def test_an_unclean_election_only_where_the_topic_allows_it() -> None:
    clean = state(1, (1, 2, 3), (1,))
    change = decide(clean, alive(3))
    assert change is not None and change.leader == -1
    unclean = state(1, (1, 2, 3), (1,), unclean=True)
    change = decide(unclean, alive(3))
    assert change is not None
    assert (change.leader, change.isr, change.unclean) == (3, (3,), True)
    # an in-sync member alive is always preferred
    change = decide(state(1, (1, 2, 3), (1, 2), unclean=True), alive(2, 3))
    assert change is not None and (change.leader, change.unclean) == (2, False)


def test_a_partition_of_one_replica_is_never_touched() -> None:
    assert decide(state(1, (1,), (1,)), alive()) is None
    assert decide(state(1, (1,), (1,), unclean=True), alive(2)) is None


# --- liveness, AlterPartition and topic settings -----------------------------------------


def test_liveness_by_heartbeat_age_and_unknown_nodes_only_in_the_grace() -> None:
    live = Liveness({1: 1_000, 2: 3_000}, now_ms=3_500, session_timeout_ms=2_000)
    assert not live.alive(1) and live.alive(2) and not live.alive(3)
    graced = Liveness({1: 1_000}, now_ms=3_500, session_timeout_ms=2_000, unknown_alive=True)
    assert graced.alive(3) and not graced.alive(1)


def test_an_alter_isr_must_hold_the_leader_only_replicas_and_live_joiners() -> None:
    stored = state(1, (1, 2, 3), (1, 2))
    live = Liveness({1: 0, 2: 0, 3: 0}, now_ms=100, session_timeout_ms=2_000)
    assert check_isr(stored, [2, 1, 3], live) == (1, 2, 3)  # kept in replica order
    assert check_isr(stored, [1], live) == (1,)
    for isr, words in (([2, 3], "leader"), ([1, 4], "not replicas"), ([1, 1], "twice")):
        with pytest.raises(InvalidRequestError, match=words):
            check_isr(stored, isr, live)
    dead3 = Liveness({1: 0, 2: 0, 3: -5_000}, now_ms=100, session_timeout_ms=2_000)
    with pytest.raises(InvalidRequestError, match="not alive"):
        check_isr(stored, [1, 3], dead3)
    assert check_isr(stored, [1, 2], dead3) == (1, 2)  # members already in stay


def test_topic_replication_defaults_and_limits() -> None:
    assert TopicReplication.choose(None, None, False, default=1, nodes=3) == TopicReplication(1, 1)
    assert TopicReplication.choose(3, None, True, default=1, nodes=3) == TopicReplication(
        3, 2, True
    )
    assert TopicReplication.choose(None, 3, False, default=3, nodes=3).min_insync == 3
    with pytest.raises(InvalidRequestError, match="larger than the number of storage nodes"):
        TopicReplication.choose(4, None, False, default=1, nodes=3)
    with pytest.raises(InvalidRequestError, match="default"):
        TopicReplication.choose(None, None, False, default=3, nodes=2)
    with pytest.raises(InvalidRequestError, match="min_insync_replicas"):
        TopicReplication.choose(2, 3, False, default=1, nodes=3)


def test_stored_lists_of_node_ids_are_checked() -> None:
    assert decode_ids("[1,2]") == (1, 2)
    assert decode_ids("") == ()
    for bad in ('{"a": 1}', "[1, true]", '["1"]'):
        with pytest.raises(ValueError):
            decode_ids(bad)
    with pytest.raises(ValueError):
        decode_ids("[1,")


def test_leadership_goes_back_to_the_preferred_replica_only_when_it_is_in_sync() -> None:
    moved = prefer(state(leader=2, replicas=(1, 2, 3), isr=(1, 2, 3)), alive(1, 2, 3))
    assert moved is not None and (moved.leader, moved.isr) == (1, (1, 2, 3))
    assert not moved.removed and not moved.unclean
    # not while the preferred replica is out of sync, dead, or the leader is gone
    assert prefer(state(leader=2, replicas=(1, 2, 3), isr=(2, 3)), alive(1, 2, 3)) is None
    assert prefer(state(leader=2, replicas=(1, 2, 3), isr=(1, 2, 3)), alive(2, 3)) is None
    assert prefer(state(leader=-1, replicas=(1, 2, 3), isr=(1, 2)), alive(1, 2)) is None
    assert prefer(state(leader=1, replicas=(1, 2, 3), isr=(1, 2, 3)), alive(1, 2, 3)) is None
    assert prefer(state(leader=1, replicas=(1,), isr=(1,)), alive(1)) is None
