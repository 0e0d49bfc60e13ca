"""Fetches made ahead of the application: the consumer's pipelining.

While the application works on the records of the last poll, the next chunk of each
partition with more to read is already being fetched, so a poll finds it there instead
of waiting a round trip (and the node's read) for it. A fetch ahead is made for one
offset (``ConsumerCore.ahead_offset`` says which); it is used only when the partition
comes to fetch from exactly there (``take``), so a seek or a new assignment in the
meantime, or a guess that the answer before proved wrong, simply drops it. A failed
fetch ahead is dropped too: the poll then fetches as it would have anyway, and meets
the error with its retries and its handling.

``AsyncPrefetcher`` runs them as tasks of the event loop; ``Prefetcher``, its blocking
twin (the name ``sdk/_unasync.py`` gives it in the generated ``Consumer``), on a few
threads of its own. Neither touches the consumer's state: a fetch ahead only calls
the transport and decodes the answer, and the calling thread hands it to the core.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from sdk._types import TopicPartition

T = TypeVar("T")
H = TypeVar("H")

#: Threads of a blocking consumer's fetches ahead (``FETCH_AHEAD`` per partition).
PREFETCH_THREADS = 4


class _Ahead(ABC, Generic[H]):
    """The fetches under way, by partition and offset (the twins add how they run)."""

    def __init__(self) -> None:
        self._ahead: dict[TopicPartition, dict[int, H]] = {}

    def count(self, tp: TopicPartition) -> int:
        return len(self._ahead.get(tp, ()))

    def last_offset(self, tp: TopicPartition) -> int | None:
        started = self._ahead.get(tp)
        return max(started) if started else None

    def _add(self, tp: TopicPartition, offset: int, handle: H) -> None:
        self._ahead.setdefault(tp, {})[offset] = handle

    def _has(self, tp: TopicPartition, offset: int) -> bool:
        return offset in self._ahead.get(tp, {})

    def take(self, tp: TopicPartition, offset: int) -> H | None:
        """The fetch ahead of ``tp`` from ``offset``, if one was made; those from below
        it can no longer be used and are dropped."""
        started = self._ahead.get(tp)
        if not started:
            return None
        handle = started.pop(offset, None)
        for stale in [o for o in started if o < offset]:
            self._cancel(started.pop(stale))
        return handle

    def drop(self, tp: TopicPartition) -> None:
        """Drop every fetch ahead of ``tp`` (its position was set anew)."""
        for handle in self._ahead.pop(tp, {}).values():
            self._cancel(handle)

    def forget(self, keep: Iterable[TopicPartition]) -> None:
        """Drop the fetches ahead of partitions no longer assigned."""
        wanted = set(keep)
        for tp in [tp for tp in self._ahead if tp not in wanted]:
            self.drop(tp)

    def _all(self) -> list[H]:
        handles = [h for started in self._ahead.values() for h in started.values()]
        self._ahead.clear()
        return handles

    @abstractmethod
    def _cancel(self, handle: H) -> None:
        """Stop one fetch ahead (a task, or a thread's future)."""


class AsyncPrefetcher(_Ahead["asyncio.Task[T]"], Generic[T]):
    """Fetches ahead as tasks; ``T`` is what a fetch gives (the answer and its records)."""

    def start(self, tp: TopicPartition, offset: int, fetch: Callable[[], Awaitable[T]]) -> None:
        """Fetch ``tp`` from ``offset`` now, unless that fetch is under way already."""
        if not self._has(tp, offset):
            self._add(tp, offset, asyncio.ensure_future(fetch()))

    async def wait(self, handle: asyncio.Task[T]) -> T | None:
        """The fetch's result; None if it failed (the caller fetches again itself)."""
        try:
            return await handle
        except Exception:
            return None

    def _cancel(self, handle: asyncio.Task[T]) -> None:
        handle.cancel()

    async def aclose(self) -> None:
        tasks = self._all()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


class Prefetcher(_Ahead["Future[T]"], Generic[T]):
    """The blocking twin: fetches ahead on a small pool of threads, made when first
    needed (a consumer that never reads ahead starts none)."""

    def __init__(self) -> None:
        super().__init__()
        self._pool: ThreadPoolExecutor | None = None

    def start(self, tp: TopicPartition, offset: int, fetch: Callable[[], T]) -> None:
        if self._has(tp, offset):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="eos-fetch")
        self._add(tp, offset, self._pool.submit(fetch))

    def wait(self, handle: Future[T]) -> T | None:
        try:
            return handle.result()
        except Exception:
            return None

    def _cancel(self, handle: Future[T]) -> None:
        handle.cancel()  # if it is running already, its answer is just not used

    def close(self) -> None:
        for future in self._all():
            future.cancel()
        if self._pool is not None:
            # Not waiting: a fetch ahead retrying against a node that is down would hold
            # the close for its whole deadline; it ends with an error once the consumer
            # closes its transport, and nobody asks for that error.
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["PREFETCH_THREADS", "AsyncPrefetcher", "Prefetcher"]
