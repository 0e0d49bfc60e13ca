"""Fetches made ahead of the application: the consumer's pipelining.

While the application works on the records of the last poll, the next chunk of each
partition with more to read is already being fetched, so a poll finds it there instead
of waiting a round trip (and the node's read) for it. A fetch ahead is made for one
offset (``ConsumerCore.ahead_offset`` says which); it is used only when the partition
comes to fetch from exactly there (``take``), so a seek or a new assignment in the
meantime, or a guess that the answer before proved wrong, simply drops it. A failed
fetch ahead is dropped too: the poll then fetches as it would have anyway, and meets
the error with its retries and its handling.

One request to a node serves many partitions (``POST /v1/fetch``), so one handle may be
registered for several (partition, offset) pairs (``start_many``): it is cancelled only
once none of them wants it any more. The consumer's requests for records now made all go
through here too, each under its partitions' offsets, so a poll waits on whichever node
answers first (``wait_first``) while the others' long polls carry on.

``AsyncPrefetcher`` runs them as tasks of the event loop; ``Prefetcher``, its blocking
twin (the name ``sdk/_unasync.py`` gives it in the generated ``Consumer``), on a few
threads of its own. Neither touches the consumer's state: a fetch ahead only calls
the transport and decodes the answer, and the calling thread hands it to the core.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from sdk._types import TopicPartition

T = TypeVar("T")
H = TypeVar("H")

#: Threads of a blocking consumer's fetches: a long poll at each node it reads from, and
#: the fetches ahead beside them (threads are made as they are first needed).
PREFETCH_THREADS = 16

Entries = Sequence[tuple[TopicPartition, int]]


class _Ahead(ABC, Generic[H]):
    """The fetches under way, by partition and offset (the twins add how they run). A
    handle may serve several partitions; ``_refs`` counts the pairs that hold it."""

    def __init__(self) -> None:
        self._ahead: dict[TopicPartition, dict[int, H]] = {}
        self._refs: dict[H, int] = {}

    def count(self, tp: TopicPartition) -> int:
        return len(self._ahead.get(tp, ()))

    def last_offset(self, tp: TopicPartition) -> int | None:
        started = self._ahead.get(tp)
        return max(started) if started else None

    def _add(self, tp: TopicPartition, offset: int, handle: H) -> None:
        self._ahead.setdefault(tp, {})[offset] = handle
        self._refs[handle] = self._refs.get(handle, 0) + 1

    def _has(self, tp: TopicPartition, offset: int) -> bool:
        return offset in self._ahead.get(tp, {})

    def _unref(self, handle: H, *, cancel: bool) -> None:
        left = self._refs.get(handle, 1) - 1
        if left > 0:
            self._refs[handle] = left
            return
        self._refs.pop(handle, None)
        if cancel:
            self._cancel(handle)

    def peek(self, tp: TopicPartition, offset: int) -> H | None:
        """The fetch of ``tp`` from ``offset`` under way or answered, left in place."""
        return self._ahead.get(tp, {}).get(offset)

    def take(self, tp: TopicPartition, offset: int) -> H | None:
        """The fetch ahead of ``tp`` from ``offset``, if one was made; those from below
        it can no longer be used and are dropped."""
        started = self._ahead.get(tp)
        if not started:
            return None
        handle = started.pop(offset, None)
        if handle is not None:
            self._unref(handle, cancel=False)
        for stale in [o for o in started if o < offset]:
            self._unref(started.pop(stale), cancel=True)
        return handle

    def drop(self, tp: TopicPartition) -> None:
        """Drop every fetch ahead of ``tp`` (its position was set anew); a request that
        other partitions still wait for goes on."""
        for handle in self._ahead.pop(tp, {}).values():
            self._unref(handle, cancel=True)

    def forget(self, keep: Iterable[TopicPartition]) -> None:
        """Drop the fetches ahead of partitions no longer assigned."""
        wanted = set(keep)
        for tp in [tp for tp in self._ahead if tp not in wanted]:
            self.drop(tp)

    def _all(self) -> list[H]:
        handles = list(self._refs)
        self._ahead.clear()
        self._refs.clear()
        return handles

    @abstractmethod
    def _cancel(self, handle: H) -> None:
        """Stop one fetch ahead (a task, or a thread's future)."""

    @abstractmethod
    def ready(self, handle: H) -> bool:
        """Whether the fetch has its answer (or failed): ``wait`` returns at once."""


class AsyncPrefetcher(_Ahead["asyncio.Task[T]"], Generic[T]):
    """Fetches ahead as tasks; ``T`` is what a fetch gives (the answer and its records)."""

    def start(self, tp: TopicPartition, offset: int, fetch: Callable[[], Awaitable[T]]) -> None:
        """Fetch ``tp`` from ``offset`` now, unless that fetch is under way already."""
        if not self._has(tp, offset):
            self.start_many([(tp, offset)], fetch)

    def start_many(
        self, entries: Entries, fetch: Callable[[], Awaitable[T]]
    ) -> asyncio.Task[T]:
        """One fetch for every (partition, offset) of ``entries`` (none under way yet)."""
        handle = asyncio.ensure_future(fetch())
        for tp, offset in entries:
            self._add(tp, offset, handle)
        return handle

    async def wait(self, handle: asyncio.Task[T]) -> T | None:
        """The fetch's result; None if it failed (the caller fetches again itself)."""
        try:
            return await handle
        except Exception:
            return None

    async def wait_first(self, handles: list[asyncio.Task[T]], timeout_s: float) -> None:
        """Until one of ``handles`` has its answer, at most ``timeout_s``; with none, sleep
        that long (a poll whose partitions all wait out a backoff)."""
        if not handles:
            await asyncio.sleep(max(timeout_s, 0.0))
            return
        await asyncio.wait(handles, timeout=max(timeout_s, 0.0),
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip

    def ready(self, handle: asyncio.Task[T]) -> bool:
        return handle.done()

    def _cancel(self, handle: asyncio.Task[T]) -> None:
        handle.cancel()

    async def aclose(self) -> None:
        tasks = self._all()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


#: How long closing a blocking consumer waits for its fetches under way.
CLOSE_WAIT_S = 2.0


class Prefetcher(_Ahead["Future[T]"], Generic[T]):
    """The blocking twin: fetches ahead on a small pool of threads, made when first
    needed (a consumer that never reads ahead starts none)."""

    def __init__(self) -> None:
        super().__init__()
        self._pool: ThreadPoolExecutor | None = None

    def start(self, tp: TopicPartition, offset: int, fetch: Callable[[], T]) -> None:
        if not self._has(tp, offset):
            self.start_many([(tp, offset)], fetch)

    def start_many(self, entries: Entries, fetch: Callable[[], T]) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="eos-fetch")
        handle = self._pool.submit(fetch)
        for tp, offset in entries:
            self._add(tp, offset, handle)
        return handle

    def wait(self, handle: Future[T]) -> T | None:
        try:
            return handle.result()
        except Exception:
            return None

    def wait_first(self, handles: list[Future[T]], timeout_s: float) -> None:
        if not handles:
            time.sleep(max(timeout_s, 0.0))
            return
        concurrent.futures.wait(handles, timeout=max(timeout_s, 0.0),
                                return_when=concurrent.futures.FIRST_COMPLETED)  # fmt: skip

    def ready(self, handle: Future[T]) -> bool:
        return handle.done()

    def _cancel(self, handle: Future[T]) -> None:
        handle.cancel()  # if it is running already, its answer is just not used

    def close(self) -> None:
        running = [future for future in self._all() if not future.cancel()]
        if self._pool is not None:
            # A fetch already under way (a long poll, usually) is given a moment to end,
            # so the consumer closes its transport after it and no connection is left
            # open behind the close. Not longer: a fetch retrying against a node that is
            # down would hold the close for its whole deadline; it ends with an error
            # once the transport is closed, and nobody asks for that error.
            concurrent.futures.wait(running, timeout=CLOSE_WAIT_S)
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["PREFETCH_THREADS", "AsyncPrefetcher", "Prefetcher"]
