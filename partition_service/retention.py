"""The node's retention loop: every ``retention_check_interval_ms`` each partition here is
cleaned by its role (Kafka's log.retention.check.interval.ms and log cleaner in one loop).

* a partition this node leads deletes the head segments its topic's retention lets go
  (``cleaner.apply_retention``), or, for ``__consumer_offsets``, is compacted
  (``cleaner.compact_offsets``); the records compaction copies forward are made durable
  before the loop goes on, like any append;
* a partition this node follows moves its log start to the leader's, learned from the
  fetch answers (``cleaner.follow_leader_start``).

The rules live in ``partition_service.log.cleaner``; this loop only runs them on the event
loop (so a pass never interleaves with an append to the same log), counts what they
deleted, and logs a pass that fails without stopping the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC
from partition_service.log.cleaner import (
    NOTHING,
    CleanResult,
    apply_retention,
    compact_offsets,
    follow_leader_start,
)
from partition_service.metrics import NodeMetrics
from partition_service.partition import Partition
from partition_service.registry import PartitionRegistry

log = logging.getLogger("eos.node.retention")


def now_ms() -> int:
    return int(time.time() * 1000)


class RetentionLoop:
    """Cleans every partition of ``registry`` now and then."""

    def __init__(
        self,
        registry: PartitionRegistry,
        metrics: NodeMetrics,
        *,
        interval_ms: int,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.interval_s = interval_ms / 1000
        self.clock = clock

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.run_once()

    async def run_once(self) -> int:
        """One pass over every partition; returns how many segments were deleted."""
        deleted = 0
        for (topic, index), partition in list(self.registry.partitions.items()):
            try:
                result = await self.clean(partition)
            except Exception:  # one partition's failure must not stop the others
                log.exception("retention of %s-%d failed", topic, index)
                continue
            if result.deleted:
                deleted += len(result.deleted)
                self.metrics.deleted_segments.labels(topic).inc(len(result.deleted))
                self.metrics.deleted_bytes.labels(topic).inc(result.deleted_bytes)
                log.info("%s-%d: %d segments (%d bytes) deleted, log start now %d", topic,
                         index, len(result.deleted), result.deleted_bytes,
                         partition.engine.log_start_offset)  # fmt: skip
            if result.copied:
                self.metrics.compacted_copies.labels(topic).inc(result.copied)
        return deleted

    async def clean(self, partition: Partition) -> CleanResult:
        engine = partition.engine
        if partition.committer.failed is not None:
            return NOTHING  # storage failed: touch nothing more
        if partition.role.deleted:
            return NOTHING  # deleted while the pass cleaned others: its files are closed
        if not partition.role.leads:
            if partition.leader_log_start is None:
                return NOTHING
            return follow_leader_start(engine, partition.leader_log_start)
        if engine.topic == CONSUMER_OFFSETS_TOPIC:
            result = compact_offsets(engine, self.clock())
            if result.copied:
                await partition.committer.wait_durable(engine.log_end_offset)
                partition.notify()
            return result
        return apply_retention(engine, partition.retention, self.clock())
