"""The partitions this node leads, found on disk at start and created on request.

Each partition is a directory ``<topic>-<partition>`` under the data directory. Creating
one is idempotent and durable (the directory entry is fsynced) so a partition the
coordinator was told exists survives a crash of the node.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, topic_name_problem
from eos_protocol.errors import (
    InvalidRequestError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.partitioning import group_offsets_partition
from partition_service.group_commit import Durability
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import LogConfig, fsync_directory
from partition_service.partition import Limits, Partition
from partition_service.replication.role import is_marked_replicated, mark_replicated

log = logging.getLogger("eos.node.registry")


def directory_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_directory_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` of a partition directory; None for anything else, including
    a directory of a topic no request could name (``..-0``, left by an older version)."""
    topic, sep, number = name.rpartition("-")
    if not sep or not number.isdigit() or topic_name_problem(topic) is not None:
        return None
    return topic, int(number)


class PartitionRegistry:
    def __init__(
        self,
        data_dir: Path,
        *,
        log_config: LogConfig,
        durability: Durability,
        limits: Limits,
        group_offset_partitions: int,
        node_id: int = 1,
    ) -> None:
        self.data_dir = data_dir
        self.node_id = node_id
        self.log_config = log_config
        self.durability = durability
        self.limits = limits
        self.group_offset_partitions = group_offset_partitions
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._create_lock = asyncio.Lock()

    def load_all(self) -> int:
        """Open every partition found on disk (recovering each); returns how many."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.data_dir.iterdir()):
            parsed = parse_directory_name(path.name) if path.is_dir() else None
            if parsed is None:
                if path.is_dir() and path.name.rpartition("-")[2].isdigit():
                    log.warning("left alone: %s is not a partition of a legal topic", path)
                continue
            self.partitions[parsed] = self._open(path, *parsed)
        return len(self.partitions)

    def _open(self, path: Path, topic: str, index: int) -> Partition:
        engine = PartitionEngine(path, topic, index, self.log_config)
        engine.open()
        if engine.log.recovered_batches:
            log.info(
                "recovered %s-%d: %d batches replayed, log end %d",
                topic,
                index,
                engine.log.recovered_batches,
                engine.log_end_offset,
            )
        partition = Partition(
            engine,
            durability=self.durability,
            limits=self.limits,
            node_id=self.node_id,
        )
        partition.role.awaits_controller = is_marked_replicated(path)
        return partition

    def start(self) -> None:
        for partition in self.partitions.values():
            partition.start()

    async def stop(self) -> None:
        for partition in list(self.partitions.values()):
            await partition.stop()

    async def create(self, topic: str, index: int, *, replicated: bool = False) -> bool:
        """Create a partition here; False if it existed already. A ``replicated`` one
        is marked so on disk (``awaits_controller``): it is led by the replica the
        controller names, never here alone, before and after a restart alike."""
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidRequestError(f"invalid topic name {topic!r}: {problem}")
        async with self._create_lock:
            if (topic, index) in self.partitions:
                return False
            path = self.data_dir / directory_name(topic, index)
            partition = self._open(path, topic, index)
            if replicated and not partition.role.awaits_controller:
                mark_replicated(path)
                partition.role.awaits_controller = True
            fsync_directory(self.data_dir)
            self.partitions[(topic, index)] = partition
            partition.start()
            return True

    def get(self, topic: str, index: int) -> Partition:
        partition = self.partitions.get((topic, index))
        if partition is None:
            raise UnknownTopicOrPartitionError(f"partition {topic}-{index} is not on this node")
        return partition

    def group_coordinator(self, group_id: str) -> Partition:
        index = group_offsets_partition(group_id, self.group_offset_partitions)
        partition = self.partitions.get((CONSUMER_OFFSETS_TOPIC, index))
        if partition is None:
            raise NotCoordinatorError(
                f"group {group_id!r} is stored in {CONSUMER_OFFSETS_TOPIC}-{index}, "
                "which is not on this node"
            )
        partition.role.require_leader()
        return partition
