"""acks=all on a real ``Partition`` (engine on files, group commit, the leader's follower
bookkeeping), with the controller's decisions applied by hand: no process, no socket.

The rule (Kafka's ``checkEnoughReplicasReachOffset``): a write is acknowledged only if,
when the high watermark covers it, at least ``min_insync_replicas`` replicas are in sync.
The ISR shrinking to the leader alone moves the high watermark to the leader's log end at
once, which is exactly when a wait that only checked the ISR inside its loop acknowledged
a write no follower had (issue 27). Records, markers and offset commits share the wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from eos_protocol.errors import (
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    TransactionAbortableError,
)
from eos_protocol.node import RecordIn
from partition_service.group_commit import Durability
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import LogConfig
from partition_service.partition import Limits, Partition
from partition_service.replication.isr import LeaderReplicas
from partition_service.replication.role import Assignment
from partition_service.verification_guard import VerificationGuards

pytestmark = pytest.mark.unit

REPLICAS = (1, 2, 3)
NOW = 1_700_000_000_000


def _assignment(isr: tuple[int, ...], *, leader: int = 1, epoch: int = 1) -> Assignment:
    return Assignment(
        leader=leader, leader_epoch=epoch, partition_epoch=len(isr), replicas=REPLICAS,
        isr=isr, min_insync_replicas=2,
    )  # fmt: skip


def _leading(tmp_path: Path) -> Partition:
    engine = PartitionEngine(tmp_path / "p", "t", 0, LogConfig())
    engine.open()
    partition = Partition(
        engine,
        durability=Durability(fsync=False, checkpoint_interval_ms=1000, inline_fsync_under_us=0),
        limits=Limits(),
        clock=lambda: NOW,
    )
    _lead(partition, _assignment(REPLICAS))
    partition.start()
    return partition


def _lead(partition: Partition, assignment: Assignment) -> None:
    """What the replica manager does when told to lead (``ReplicationManager._lead``)."""
    engine = partition.engine
    engine.become_leader(assignment.leader_epoch)
    partition.role.assignment = assignment
    partition.role.leader = LeaderReplicas(
        leader=1, leader_epoch=assignment.leader_epoch, partition_epoch=0,
        replicas=list(REPLICAS), isr=list(assignment.isr), min_insync_replicas=2,
        epoch_start_offset=engine.log_end_offset, lag_time_ms=1000, now_ms=NOW,
        high_watermark=engine.high_watermark,
    )  # fmt: skip
    engine.replicated_offset = engine.high_watermark


def _shrink_isr(partition: Partition, isr: tuple[int, ...]) -> None:
    """The controller accepted a smaller ISR (AlterPartition) and the leader hears it."""
    leader = partition.role.leader
    assert leader is not None
    partition.role.assignment = _assignment(isr)
    leader.accept_state(isr, leader.partition_epoch + 1, leader.min_insync_replicas)
    partition.notify()


async def _write(partition: Partition, value: str) -> None:
    partition.role.require_leader(acks_all=True)
    result = partition.append_rows(partition.rows([_record(value)]))
    await partition.wait_durable(result)


def _record(value: str) -> RecordIn:
    return RecordIn(value=value)


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"waited for {what}")


def test_a_write_in_flight_when_the_isr_shrinks_to_the_leader_is_refused(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        partition = _leading(tmp_path)
        try:
            waiting = asyncio.ensure_future(_write(partition, "only on the leader"))
            await _until(lambda: partition.engine.durable_offset == 1, "the write on disk")
            assert not waiting.done()  # no follower has it: not acknowledged
            _shrink_isr(partition, (1,))
            # the high watermark jumped over the write (the leader is the ISR alone) ...
            assert partition.engine.high_watermark == 1
            # ... and yet it is not acknowledged: one replica has it, the minimum is two
            with pytest.raises(NotEnoughReplicasAfterAppendError, match="fewer than"):
                await asyncio.wait_for(waiting, 10)
            # a new write is refused before it is written
            with pytest.raises(NotEnoughReplicasError):
                await _write(partition, "refused")
            assert partition.engine.log_end_offset == 1
        finally:
            await partition.stop()

    asyncio.run(run())


def test_a_write_covered_while_two_replicas_are_in_sync_is_acknowledged(tmp_path: Path) -> None:
    async def run() -> None:
        partition = _leading(tmp_path)
        try:
            waiting = asyncio.ensure_future(_write(partition, "on two replicas"))
            await _until(lambda: partition.engine.durable_offset == 1, "the write on disk")
            leader = partition.role.leader
            assert leader is not None
            leader.on_fetch(2, 1, 1, NOW)  # follower 2 has it; follower 3 stopped
            _shrink_isr(partition, (1, 2))
            await asyncio.wait_for(waiting, 10)
        finally:
            await partition.stop()

    asyncio.run(run())


def test_a_marker_in_flight_when_the_isr_shrinks_is_refused(tmp_path: Path) -> None:
    async def run() -> None:
        partition = _leading(tmp_path)
        try:
            result = partition.append_rows(
                partition.rows([_record("in a transaction")]),
                producer_id=7, producer_epoch=0, base_sequence=0, transactional=True,
            )  # fmt: skip
            leader = partition.role.leader
            assert leader is not None
            await partition.committer.wait_durable(result.last_offset + 1)
            leader.on_fetch(2, 1, 1, NOW)
            leader.on_fetch(3, 1, 1, NOW)
            marker = asyncio.ensure_future(partition.write_marker(7, 0, 0, "COMMIT"))
            await _until(lambda: partition.engine.durable_offset == 2, "the marker on disk")
            _shrink_isr(partition, (1,))
            with pytest.raises(NotEnoughReplicasAfterAppendError):
                await asyncio.wait_for(marker, 10)
            # and while the ISR is short, no marker is written at all
            with pytest.raises(NotEnoughReplicasError):
                await partition.write_marker(8, 0, 0, "ABORT")
            assert partition.engine.log_end_offset == 2
        finally:
            await partition.stop()

    asyncio.run(run())


def test_a_write_whose_leader_epoch_ended_while_it_waited_is_refused(tmp_path: Path) -> None:
    """Led again in a later epoch, the offset may hold another record: the wait that
    began in epoch 1 does not answer for epoch 2's high watermark."""

    async def run() -> None:
        partition = _leading(tmp_path)
        try:
            waiting = asyncio.ensure_future(_write(partition, "epoch 1"))
            await _until(lambda: partition.engine.durable_offset == 1, "the write on disk")
            _lead(partition, _assignment(REPLICAS, epoch=2))
            partition.notify()
            with pytest.raises(NotLeaderOrFollowerError, match="epoch 1 to 2"):
                await asyncio.wait_for(waiting, 10)
        finally:
            await partition.stop()

    asyncio.run(run())


def test_a_marker_during_a_verification_spoils_it() -> None:
    """KIP-890's verification guard: a marker for the producer while its batch was being
    verified means the transaction the verification vouched for is over."""
    guards = VerificationGuards()
    with guards.guard(7) as spoiled, guards.guard(7) as same:
        with guards.guard(8) as other:
            guards.invalidate(7)
            with pytest.raises(TransactionAbortableError, match="producer 7"):
                guards.check(spoiled, 7)
            with pytest.raises(TransactionAbortableError):
                guards.check(same, 7)
            # under transaction version 2 the epoch fences a late batch instead: the marker
            # may be the previous transaction's, which the batch's own add waited for
            guards.check(spoiled, 7, transaction_version=2)
            guards.check(other, 8)  # another producer's verification stands
        with guards.guard(7) as fresh:  # a verification begun after the marker stands
            guards.check(fresh, 7)
    assert len(guards) == 0  # nothing kept once no verification is under way


def test_a_marker_spoils_the_producers_verification_under_way(tmp_path: Path) -> None:
    """The partition's marker path spoils the guard: a batch verified before the marker
    arrived is refused instead of opening a transaction nobody would end."""

    async def run() -> None:
        partition = _leading(tmp_path)
        try:
            with partition.verifications.guard(7) as guard:
                marker = asyncio.ensure_future(partition.write_marker(7, 0, 0, "ABORT"))
                await _until(lambda: partition.engine.log_end_offset == 1, "the marker written")
                with pytest.raises(TransactionAbortableError):
                    partition.verifications.check(guard, 7)
            marker.cancel()  # it waits for followers that never fetch here
        finally:
            await partition.stop()

    asyncio.run(run())
