"""The partitions this node leads, found on disk at start, created and deleted on request.

Each partition is a directory ``<topic>-<partition>`` under the data directory. Creating
one is idempotent and durable (the directory entry is fsynced) so a partition the
coordinator was told exists survives a crash of the node.

Deleting a topic's partitions (``delete_topics``) renames each directory to a grave,
``<topic>-<partition>.deleted-<hex>``, a name no partition can have, and fsyncs the data
directory once: from then on the partitions are gone, whatever happens to the node. The
graves are removed on a worker thread after; one left by a crash is removed at the next
start (``load_all``), never loaded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from eos_protocol.common import CONSUMER_OFFSETS_TOPIC, topic_name_problem
from eos_protocol.errors import (
    InvalidRequestError,
    KafkaStorageError,
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

#: The most partitions a creation opens on the event loop rather than on a worker thread.
INLINE_CREATES = 8
#: Threads a stopping node flushes and checkpoints its partitions on (fsyncs of
#: different files, which the disk serves side by side).
STOP_THREADS = 16
#: How long a deletion works on the event loop before it lets other work run.
DELETE_SLICE_S = 0.02
#: What a deleted partition's directory name is given before the directory is removed.
GRAVE_MARK = ".deleted-"
_GRAVE = re.compile(r"(?P<partition>.+-[0-9]+)\.deleted-[0-9a-f]+")


class NewPartition(NamedTuple):
    """A partition to create (``PartitionRegistry.create_many``)."""

    topic: str
    partition: int
    replicated: bool = False


def directory_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_directory_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` of a partition directory; None for anything else, including
    a directory of a topic no request could name (``..-0``, left by an older version)."""
    topic, sep, number = name.rpartition("-")
    if not sep or not number.isdigit() or topic_name_problem(topic) is not None:
        return None
    return topic, int(number)


def grave_name(directory: str) -> str:
    """The name a deleted partition's directory is renamed to: never a partition's, as
    its last ``-`` is followed by something that is not a number (hex with a letter)."""
    while True:
        token = secrets.token_hex(8)
        if not token.isdigit():
            return f"{directory}{GRAVE_MARK}{token}"


def is_grave(name: str) -> bool:
    """Whether ``name`` is a deleted partition's directory (``grave_name``). A partition's
    own name never is, even one whose topic has ``.deleted-`` in it."""
    if parse_directory_name(name) is not None:
        return False
    found = _GRAVE.fullmatch(name)
    return found is not None and parse_directory_name(found["partition"]) is not None


def remove_graves(graves: Sequence[Path]) -> None:
    """Remove deleted partitions' directories (on a worker thread: a log of gigabytes
    takes a while); one that cannot be removed is logged, and tried again at the next
    start."""
    for grave in graves:
        try:
            shutil.rmtree(grave)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s not removed (%s); removed at the next start", grave, exc)


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
        # held by creations and deletions alike: a partition created while its topic is
        # deleted must not open the old directory before it is renamed
        self._create_lock = asyncio.Lock()
        self._removals: set[asyncio.Task[None]] = set()  # graves being removed

    def load_all(self) -> int:
        """Open every partition found on disk (recovering each); returns how many. The
        graves a deletion left (the node stopped before it removed them) are removed."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.data_dir.iterdir()):
            if path.is_dir() and is_grave(path.name):
                log.info("removing %s, a deleted partition's directory", path)
                remove_graves([path])
                continue
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
        """Stop every partition: their commit loops, then their final flush and checkpoint
        side by side on threads. One after the other, the three fsyncs of each took a node
        of 5,000 partitions over five seconds to stop; the disk takes them in parallel."""
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        partitions = list(self.partitions.values())
        for partition in partitions:
            await partition.committer.stop_loop()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(STOP_THREADS, thread_name_prefix="partition-stop") as pool:
            durable = await asyncio.gather(
                *(loop.run_in_executor(pool, p.finish) for p in partitions),
                return_exceptions=True,
            )
        for partition, outcome in zip(partitions, durable, strict=True):
            if isinstance(outcome, BaseException):
                log.error("%s-%d did not stop cleanly: %r", partition.topic, partition.index,
                          outcome)  # fmt: skip
            else:
                partition.committer.release(outcome)

    async def create(self, topic: str, index: int, *, replicated: bool = False) -> bool:
        """Create a partition here; False if it existed already. A ``replicated`` one
        is marked so on disk (``awaits_controller``): it is led by the replica the
        controller names, never here alone, before and after a restart alike."""
        (created,) = await self.create_many([NewPartition(topic, index, replicated)])
        return created

    async def create_many(self, wanted: Sequence[NewPartition]) -> list[bool]:
        """Create partitions here, as ``create`` does each; for each, False if it existed
        already. The data directory is fsynced once for the whole batch: once per
        partition made a topic of a thousand partitions cost a thousand fsyncs per node.

        Every name is checked before anything touches the disk (INVALID_REQUEST). Should
        one partition fail to open (a disk error), those opened before it are still made
        durable and served, and the error is raised (a retry finds them there).

        A batch of more than ``INLINE_CREATES`` is opened on a worker thread, so that the
        node goes on serving meanwhile (hundreds of partitions take a second or more). A
        smaller one is opened on the event loop: the heartbeat recreates lost partitions
        one ``create`` after another, and a hop to a thread costs a turn of a loop that is
        busy with those very partitions, which added up to seconds without a heartbeat."""
        for topic, _partition, _replicated in wanted:
            problem = topic_name_problem(topic)
            if problem is not None:
                raise InvalidRequestError(f"invalid topic name {topic!r}: {problem}")
        if len(wanted) <= INLINE_CREATES:
            return await self._create_many(list(wanted), inline=True)
        # shielded: a caller that goes away while the thread works must neither leave the
        # partitions opened but unserved nor release the lock before they are served
        return await asyncio.shield(self._create_many(list(wanted), inline=False))

    async def _create_many(self, wanted: list[NewPartition], *, inline: bool) -> list[bool]:
        async with self._create_lock:
            first: dict[tuple[str, int], NewPartition] = {}
            for w in wanted:
                first.setdefault((w.topic, w.partition), w)
            fresh = [w for key, w in first.items() if key not in self.partitions]
            opened: list[tuple[NewPartition, Partition]] = []
            failure: BaseException | None = None
            if fresh and inline:
                failure = self._open_new(fresh, opened)
            elif fresh:
                failure = await asyncio.to_thread(self._open_new, fresh, opened)
            for new, partition in opened:
                self.partitions[(new.topic, new.partition)] = partition
                partition.start()
            if failure is not None:
                raise failure
            made = {(new.topic, new.partition) for new, _partition in opened}
            answers = []
            for w in wanted:
                answers.append((w.topic, w.partition) in made)
                made.discard((w.topic, w.partition))  # a key asked twice: created once
            return answers

    def _open_new(
        self, fresh: list[NewPartition], opened: list[tuple[NewPartition, Partition]]
    ) -> BaseException | None:
        """Open each new partition, then fsync the data directory once; returns the error
        that stopped it, if any, with ``opened`` holding what was opened before."""
        failure: BaseException | None = None
        try:
            for new in fresh:
                path = self.data_dir / directory_name(new.topic, new.partition)
                partition = self._open(path, new.topic, new.partition)
                if new.replicated and not partition.role.awaits_controller:
                    mark_replicated(path)
                    partition.role.awaits_controller = True
                opened.append((new, partition))
        except Exception as exc:
            failure = exc
        if opened:
            try:
                fsync_directory(self.data_dir)
            except OSError as exc:  # not durable: served by none, asked again later
                for _new, partition in opened:
                    partition.engine.close()
                opened.clear()
                return exc
        return failure

    async def delete_topics(
        self, topics: Collection[str], *, on_removed: Callable[[Partition], None]
    ) -> dict[str, int]:
        """Delete every partition of ``topics`` held here; how many of each (0: none held,
        already deleted or never created). The names must be legal topic names.

        Each partition leaves the registry first, all at once, so that every new request
        for it is answered UNKNOWN_TOPIC_OR_PARTITION; ``on_removed`` is told of each (to
        stop its replication), then it is discarded (``Partition.discard``: requests
        still holding it are answered, its files closed), in slices of ``DELETE_SLICE_S``
        between which the node's other work runs (its heartbeat above all). Then, on a
        worker thread, every directory of those topics in the data directory (also one
        the registry did not hold) is renamed to a grave and the data directory fsynced:
        the deletion is durable when this returns. The graves are removed after, on a
        worker thread too.

        KAFKA_STORAGE_ERROR when a directory could not be renamed or the rename made
        durable: the partitions are not served any more, but their directories may come
        back at the next start, so the caller must ask again (and a retry renames them).

        Shielded, as a creation is: a caller that goes away must not leave partitions out
        of the registry but still on disk, to come back at the next start.
        """
        return await asyncio.shield(self._delete_topics(set(topics), on_removed))

    async def _delete_topics(
        self, wanted: set[str], on_removed: Callable[[Partition], None]
    ) -> dict[str, int]:
        async with self._create_lock:
            doomed = [(key, p) for key, p in self.partitions.items() if key[0] in wanted]
            for key, _partition in doomed:
                del self.partitions[key]
            slice_started = time.monotonic()
            for _key, partition in doomed:
                if time.monotonic() - slice_started > DELETE_SLICE_S:
                    await asyncio.sleep(0)
                    slice_started = time.monotonic()
                try:
                    on_removed(partition)
                    await partition.discard()
                except Exception:  # one partition's failure must not keep the others
                    log.exception("%s-%d not closed cleanly", partition.topic, partition.index)
            found, graves, failure = await asyncio.to_thread(self._bury, wanted)
        if graves:
            removal = asyncio.create_task(asyncio.to_thread(remove_graves, graves),
                                          name="remove deleted partitions")  # fmt: skip
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)
        if failure is not None:
            raise KafkaStorageError(f"deleted partitions' directories not removed: {failure}")
        for (topic, index), _partition in doomed:
            found.setdefault(topic, set()).add(index)
        return {topic: len(found.get(topic, ())) for topic in wanted}

    def _bury(self, topics: set[str]) -> tuple[dict[str, set[int]], list[Path], OSError | None]:
        """Rename every partition directory of ``topics`` to a grave, then fsync the data
        directory once; the partitions found on disk by topic, the graves, and the error
        that stopped it, if any (what was renamed before it is made durable all the same)."""
        found: dict[str, set[int]] = {}
        graves: list[Path] = []
        failure: OSError | None = None
        try:
            with os.scandir(self.data_dir) as entries:  # read whole before renaming in it
                doomed = [(e.name, parsed) for e in entries if e.is_dir()
                          and (parsed := parse_directory_name(e.name)) is not None
                          and parsed[0] in topics]  # fmt: skip
            for name, (topic, index) in doomed:
                grave = self.data_dir / grave_name(name)
                os.rename(self.data_dir / name, grave)
                graves.append(grave)
                found.setdefault(topic, set()).add(index)
        except OSError as exc:
            failure = exc
        if graves:
            try:
                fsync_directory(self.data_dir)
            except OSError as exc:
                failure = failure or exc
        return found, graves, failure

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
