"""Run the async clients from synchronous test code, so one test body checks both twins.

``AsyncBridge`` owns an event loop on a thread; ``blocking(client)`` gives an async client
the interface of its blocking twin (every coroutine method is run on that loop, a send's
future gets a ``result()``, ``async with transaction()`` becomes ``with``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class AsyncBridge:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, awaitable: Awaitable[T], timeout: float = 120) -> T:
        async def main() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(main(), self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the loop's thread (the async clients are single-threaded)."""

        async def main() -> T:
            return fn()

        return self.run(main())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class _Result:
    def __init__(self, bridge: AsyncBridge, future: asyncio.Future[Any]) -> None:
        self._bridge, self._future = bridge, future

    def result(self, timeout: float | None = 60) -> Any:
        return self._bridge.run(asyncio.wait_for(asyncio.shield(self._future), timeout))

    def exception(self, timeout: float | None = 60) -> BaseException | None:
        try:
            self.result(timeout)
        except Exception as exc:
            return exc
        return None


class Blocking:
    """An async client seen through the blocking twin's interface."""

    def __init__(self, client: Any, bridge: AsyncBridge) -> None:
        self._client = client
        self._bridge = bridge

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name == "send":
            return lambda *a, **k: _Result(self._bridge, self._bridge.run(attr(*a, **k)))
        if name == "transaction":
            return self._transaction
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._bridge.run(attr(*a, **k))
        if callable(attr):
            return lambda *a, **k: self._bridge.call(lambda: attr(*a, **k))
        return attr

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Blocking]:
        manager = self._client.transaction()
        self._bridge.run(manager.__aenter__())
        try:
            yield self
        except BaseException as exc:
            if not self._bridge.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._bridge.run(manager.__aexit__(None, None, None))

    def __enter__(self) -> Blocking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
