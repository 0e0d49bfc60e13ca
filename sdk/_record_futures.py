"""Cheap record futures: a ``send``'s future, and those of a ``send_many`` list, made only
when asked for.

A ``send`` returns a future per record, and at 100,000 records a second the futures
themselves become the cost: a thread ``Future`` is seven objects (its condition, lock,
waiter lists), and the garbage collector walks every one still pending, again and again,
which on this path cost more than everything else together. A list sent in one call
keeps one ``RecordFutures`` instead: batches hold ``Segment`` s of it (a contiguous run
of its records), an acknowledgement records one range (its partition, first offset,
timestamp) for the whole run, and a record's future is made when the caller asks for
that record, already settled if its range is known. Awaiting the whole list is one
future (``all_done``), settled when the last range is.

    futures = producer.send_many("orders", values)   # nothing per record yet
    producer.flush()
    futures[-1].result().offset                       # made now, already done
    futures.results()                                 # every RecordMetadata, in order

A ``send`` must return its future at once, so it gets a ``RecordFuture``: a
``concurrent.futures.Future`` in every respect but one, the condition it waits on, which
is shared by the producer's futures instead of one each (three objects fewer per record
for the collector to walk). Waits loop until their own future is done, so a wake-up for
another one is harmless.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from typing import Any, Generic, TypeVar, overload

from sdk._types import RecordMetadata

F = TypeVar("F")
T = TypeVar("T")

#: A pending future's own attributes, as this Python's ``Future.__init__`` sets them, but
#: for the condition and the two lists, which ``RecordFuture`` handles itself.
_PENDING_STATE = tuple(
    (k, v)
    for k, v in Future().__dict__.items()
    if k not in ("_condition", "_waiters", "_done_callbacks")
)
_SETTLED = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class RecordFuture(Future[T]):
    """A thread future waiting on a condition shared with its producer's other futures.

    Settling, cancelling and ``concurrent.futures.wait`` work as for any ``Future`` (they
    only hold the condition briefly, and it is re-entrant). ``result`` and ``exception``
    wait in a loop, since a notification may be for another future of the producer.

    A pending one is a single object for the garbage collector: its attributes are set
    one by one (``__dict__.update`` made each a dictionary of its own), and its two
    lists, of waiters (``concurrent.futures.wait``) and of callbacks, are made when
    first asked for. A producer's buffer holds hundreds of thousands of records, each
    with its future, and the collector walked four objects for each.
    """

    __slots__ = ("_callback_list", "_waiter_list")
    _callback_list: list[Any]
    _waiter_list: list[Any]

    def __init__(self, condition: threading.Condition) -> None:  # no super(): see above
        for name, value in _PENDING_STATE:
            setattr(self, name, value)
        self._condition = condition

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        try:
            return self._waiter_list
        except AttributeError:
            self._waiter_list = []
            return self._waiter_list

    @property
    def _done_callbacks(self) -> list[Any]:
        try:
            return self._callback_list
        except AttributeError:
            self._callback_list = []
            return self._callback_list

    def set_result(self, result: T) -> None:
        """``Future.set_result``, without making the lists to find them empty."""
        self._finish(result, failed=False)

    def set_exception(self, exception: BaseException | None) -> None:
        """``Future.set_exception``, without making the lists to find them empty."""
        self._finish(exception, failed=True)

    def _finish(self, outcome: Any, *, failed: bool) -> None:
        with self._condition:
            if self._state in _SETTLED:
                raise InvalidStateError(f"{self._state}: {self!r}")
            if failed:
                self._exception = outcome
            else:
                self._result = outcome
            self._state = FINISHED
            for waiter in getattr(self, "_waiter_list", ()):
                (waiter.add_exception if failed else waiter.add_result)(self)
            self._condition.notify_all()
        self._invoke_callbacks()

    def _invoke_callbacks(self) -> None:
        if getattr(self, "_callback_list", None):
            super()._invoke_callbacks()  # type: ignore[misc]

    def _wait_done(self, timeout: float | None) -> None:
        if self.done():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while not self.done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                self._condition.wait(left)

    def result(self, timeout: float | None = None) -> T:
        self._wait_done(timeout)
        return super().result(0)  # done: the result or its error; else TimeoutError

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_done(timeout)
        return super().exception(0)

#: (start, stop, topic, partition, first offset, timestamp, duplicate) or (start, stop, error)
_Range = tuple[Any, ...]


class Segment:
    """Records ``start:stop`` of ``group``, consecutive in one batch."""

    __slots__ = ("group", "start", "stop")

    def __init__(self, group: RecordFuturesBase[Any], start: int, stop: int) -> None:
        self.group, self.start, self.stop = group, start, stop

    def __len__(self) -> int:
        return self.stop - self.start


class RecordFuturesBase(Sequence[F], Generic[F]):
    """The futures of the records of one ``send_many`` call, in the order given.

    A ``Sequence`` of futures of the producer's flavour, each resolving to its record's
    ``RecordMetadata`` or failing with its batch's error, as ``send``'s do. ``all_done``
    is settled (to None: the records carry the outcome) once every record is.
    """

    def __init__(self, count: int, make_future: Callable[[], Any]) -> None:
        self._count = count
        self._make = make_future
        self._lock = threading.Lock()  # settled on a worker thread, read on the caller's
        self._range_of: list[_Range | None] = [None] * count
        self._made: dict[int, Any] = {}
        self._left = count
        self.all_done: Any = make_future()
        if count == 0:
            self.all_done.set_result(None)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> F: ...

    @overload
    def __getitem__(self, index: slice) -> list[F]: ...

    def __getitem__(self, index: int | slice) -> F | list[F]:
        if isinstance(index, slice):
            return [self._future(i) for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("record index out of range")
        return self._future(index)

    def __iter__(self) -> Iterator[F]:
        return (self._future(i) for i in range(self._count))

    def _future(self, i: int) -> F:
        with self._lock:
            made = self._made.get(i)
            if made is None:
                made = self._made[i] = self._make()
                known = self._range_of[i]
                if known is not None:
                    _resolve(made, known, i)
        future: F = made
        return future

    def outcome(self, i: int) -> RecordMetadata | BaseException | None:
        """Record ``i``'s metadata or error; None while it is not settled."""
        known = self._range_of[i]
        if known is None:
            return None
        if len(known) == 3:
            error: BaseException = known[2]
            return error
        start, _, topic, partition, first, ts, duplicate = known
        return RecordMetadata(topic, partition, first + i - start, ts, duplicate)

    def _metadata(self) -> list[RecordMetadata]:
        """Every record's metadata, once ``all_done`` is; the first error is raised."""
        out: list[RecordMetadata] = []
        for i in range(self._count):
            found = self.outcome(i)
            if isinstance(found, BaseException):
                raise found
            assert found is not None
            out.append(found)
        return out

    # --- settled by the producer ---------------------------------------------------------

    def settle(self, start: int, stop: int, known: _Range) -> None:
        """Records ``start:stop`` are acknowledged (``known`` from ``acked``) or failed
        (``known`` from ``failed``)."""
        with self._lock:
            if self._range_of[start] is not None:
                return  # settled already (a batch is settled once; this is a safeguard)
            self._range_of[start:stop] = [known] * (stop - start)
            waiting = [(i, f) for i, f in self._made.items() if start <= i < stop]
            self._left -= stop - start
            last = self._left == 0
        for i, future in waiting:
            _resolve(future, known, i)
        if last:
            _set(self.all_done, None)


class RecordFutures(RecordFuturesBase["Future[RecordMetadata]"]):
    """What ``Producer.send_many`` returns: ``concurrent.futures.Future`` s.

    Example::

        futures = producer.send_many("orders", ["o-1", "o-2"], keys=["c-7", "c-9"])
        producer.flush()
        first = futures[0].result()           # RecordMetadata of "o-1"
        every = futures.results(timeout=30)   # all of them, in the order given
    """

    def __init__(self, count: int) -> None:
        super().__init__(count, Future)

    def results(self, timeout: float | None = None) -> list[RecordMetadata]:
        """Wait for every record; their ``RecordMetadata`` in order, or the first error
        (``TimeoutError`` if ``timeout`` seconds pass first)."""
        self.all_done.result(timeout)
        return self._metadata()


class AsyncRecordFutures(RecordFuturesBase["asyncio.Future[RecordMetadata]"]):
    """What ``AsyncProducer.send_many`` returns: ``asyncio.Future`` s of the running loop.

    Example::

        futures = await producer.send_many("orders", ["o-1", "o-2"])
        first = await futures[0]
        every = await futures.results()
    """

    def __init__(self, count: int) -> None:
        super().__init__(count, asyncio.get_running_loop().create_future)

    async def results(self) -> list[RecordMetadata]:
        """Wait for every record; their ``RecordMetadata`` in order, or the first error."""
        await self.all_done
        return self._metadata()


def acked(
    start: int, stop: int, topic: str, partition: int, first: int, ts: int, duplicate: bool
) -> _Range:
    return (start, stop, topic, partition, first, ts, duplicate)


def failed(start: int, stop: int, exc: BaseException) -> _Range:
    return (start, stop, exc)


def _resolve(future: Any, known: _Range, i: int) -> None:
    if len(known) == 3:
        _set(future, exc=known[2])
        return
    start, _, topic, partition, first, ts, duplicate = known
    _set(future, RecordMetadata(topic, partition, first + i - start, ts, duplicate))


def _set(future: Any, result: Any = None, exc: BaseException | None = None) -> None:
    if future.done():  # cancelled by the caller
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def split(entries: Sequence[Any]) -> Iterator[tuple[Any, int]]:
    """A batch's entries (futures and segments) with the number of records of each."""
    for entry in entries:
        yield entry, (len(entry) if entry.__class__ is Segment else 1)


__all__ = [
    "AsyncRecordFutures",
    "RecordFuture",
    "RecordFutures",
    "RecordFuturesBase",
    "Segment",
    "acked",
    "failed",
    "split",
]
