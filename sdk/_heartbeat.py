"""The heartbeat drivers of a subscribed consumer: the I/O around ``GroupMember``.

Why a module beside the consumers and not in them: the blocking ``Consumer`` is generated
from ``AsyncConsumer`` (``sdk/_unasync.py``), and a heartbeat must run in the background in
a way that differs in kind between the two: an asyncio task, or a thread with its own
blocking transport (the generated code cannot start a thread where the async source starts
a task). So each consumer holds a driver, ``AsyncHeartbeat`` or ``Heartbeat`` (the name the
generator gives it), with the same methods; what the member does stays in ``GroupMember``.

Each driver loops: ask the member when the next heartbeat is due (``next_heartbeat``),
sleep until then or until woken (poll let go of or took on partitions: the coordinator must
hear it at once), send what ``begin_heartbeat`` builds to the group's coordinator, and hand
back the answer or the error. The coordinator holds a heartbeat that has nothing to tell
for up to ``max_wait_ms`` and answers at once when the member's assignment moves, so a move
is learned as it happens and the heartbeats still go about once per interval.

The coordinator is the instance owning the lease the group id hashes to; it is found with
``GET /v1/coordinators?key_type=consumer_group`` and followed on NOT_COORDINATOR by the
transport's retry rule, as for a transactional id. A failed heartbeat is the member's to
judge (``GroupMember.on_error``); the driver never ends on an error.

The rebalance callbacks run in the application's thread, inside poll, through ``invoke``:
the async consumer's may be plain or coroutine functions, the blocking one's plain only.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from sdk._config import ConsumerConfig
from sdk._group_base import GroupMember
from sdk._metadata import MetadataCache, find_coordinator_params, group_path
from sdk._transport import AsyncTransport, Req, SyncTransport
from sdk._types import TopicPartition

log = logging.getLogger("eos.sdk.groups")

#: A rebalance callback of the blocking consumer: it gets the partitions concerned.
RebalanceCallback = Callable[[set[TopicPartition]], None]
#: One of the async consumer: a plain function or a coroutine function.
AsyncRebalanceCallback = Callable[[set[TopicPartition]], Awaitable[None] | None]

#: How long the blocking consumer's close waits for its heartbeat thread; a long poll
#: still held after that ends on its own, its answer unused.
THREAD_JOIN_S = 1.0
#: After an unexpected failure of the loop itself, before it goes on.
LOOP_PAUSE_S = 1.0


def _find_params(member: GroupMember) -> dict[str, str]:
    return find_coordinator_params(member.group_id, "consumer_group")


def _attempt_s(config: ConsumerConfig, body: dict[str, Any]) -> float:
    """One attempt of a heartbeat: the coordinator's answer time, plus its long poll."""
    return (config.retry.coordinator_timeout_ms + int(body.get("max_wait_ms", 0))) / 1000


class AsyncHeartbeat:
    """Heartbeats of one member as a task of the running event loop."""

    def __init__(
        self,
        member: GroupMember,
        metadata: MetadataCache,
        config: ConsumerConfig,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._member = member
        self._metadata = metadata
        self._config = config
        self._transport = transport
        self._http: AsyncTransport | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._closed = False

    def check_callback(self, callback: AsyncRebalanceCallback) -> None:
        """Plain functions and coroutine functions both do here."""
        if not callable(callback):
            raise TypeError(f"a rebalance callback must be callable, not {callback!r}")

    async def invoke(self, callback: AsyncRebalanceCallback, parts: set[TopicPartition]) -> None:
        result = callback(parts)
        if inspect.isawaitable(result):
            await result

    def start(self) -> None:
        """Run the heartbeats from now on (called by poll: the join waits for the first)."""
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        """A heartbeat may be due at once (owned partitions or the subscription changed)."""
        self._wake.set()

    async def wait_changed(self, timeout_s: float) -> None:
        """Until poll has something to do (a new assignment, a loss), at most ``timeout_s``."""
        self._changed.clear()
        if self._member.has_work():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(0.0, timeout_s))

    async def stop(self) -> None:
        """No heartbeats from now on (until ``start``); the member stays a member until its
        session ends."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # its end, without taking the caller's cancellation

    async def leave(self) -> None:
        """Leave the group (the member's leave heartbeat); a failure is no error: the
        session's end removes the member all the same."""
        body = self._member.leave()
        if body is None:
            return
        try:
            await self._send(body, self._config.retry.coordinator_timeout_ms / 1000)
        except Exception as exc:
            log.info("group %s: leave failed (%r); the session will end it", self._member.group_id,
                     exc)  # fmt: skip

    async def commit(self, body: dict[str, Any], timeout_s: float | None) -> Any:
        """A member's offsets, through the group's coordinator (which checks the member)."""
        group = self._member.group_id
        return await self._client().call(
            Req.OFFSET_COMMIT, "POST", group_path(group, "offsets"),
            base=self._coordinator, json=body, timeout_s=timeout_s,
            invalidate=lambda exc: self._metadata.invalidate_group_coordinator(group, exc),
        )  # fmt: skip

    async def aclose(self) -> None:
        self._closed = True
        await self.stop()
        if self._http is not None:
            await self._http.aclose()

    # --- the loop ------------------------------------------------------------------------

    def _client(self) -> AsyncTransport:
        if self._http is None:
            config = self._config
            self._http = AsyncTransport(config.retry, transport=self._transport,
                headers=config.headers, token=config.token, ca_file=config.ca_file,
            )  # fmt: skip
            self._http.on_unreachable = self._metadata.unreachable
        return self._http

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("group %s: heartbeat loop failed", self._member.group_id)
                await asyncio.sleep(LOOP_PAUSE_S)

    async def _step(self) -> None:
        delay = self._member.next_heartbeat()
        if delay is None or delay > 0:
            self._wake.clear()
            delay = self._member.next_heartbeat()  # woken meanwhile?
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            return
        beat = self._member.begin_heartbeat()
        if beat is None:
            return
        try:
            body = await self._send(beat.body, self._member.call_timeout_s())
            changed = self._member.on_answer(beat, body)
        except Exception as exc:
            changed = self._member.on_error(beat, exc)
        if changed:
            self._changed.set()

    async def _send(self, body: dict[str, Any], timeout_s: float) -> Any:
        group = self._member.group_id
        return await self._client().call(
            Req.GROUP_HEARTBEAT, "POST", group_path(group, "heartbeat"),
            base=self._coordinator, json=body, timeout_s=timeout_s,
            attempt_s=_attempt_s(self._config, body),
            invalidate=lambda exc: self._metadata.invalidate_group_coordinator(group, exc),
        )  # fmt: skip

    async def _coordinator(self) -> str:
        group = self._member.group_id
        url = self._metadata.group_coordinator(group)
        if url is None:
            http = self._client()
            body = await http.call(
                Req.FIND_COORDINATOR, "GET", "/v1/coordinators",
                base=lambda: http.bootstrap(self._metadata), params=_find_params(self._member),
                timeout_s=self._config.retry.coordinator_timeout_ms / 1000,
            )  # fmt: skip
            self._metadata.set_group_coordinator(group, str(body["url"]))
            url = str(body["url"]).rstrip("/")
        return url


class Heartbeat:
    """The blocking twin: heartbeats on a daemon thread, with its own transport."""

    def __init__(
        self,
        member: GroupMember,
        metadata: MetadataCache,
        config: ConsumerConfig,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._member = member
        self._metadata = metadata
        self._config = config
        self._transport = transport
        self._http: SyncTransport | None = None
        self._http_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._changed = threading.Event()
        self._closed = False

    def check_callback(self, callback: RebalanceCallback) -> None:
        """The blocking consumer cannot run a coroutine: refuse one at ``subscribe``."""
        if not callable(callback):
            raise TypeError(f"a rebalance callback must be callable, not {callback!r}")
        if inspect.iscoroutinefunction(callback):
            raise TypeError("the blocking Consumer takes plain functions as rebalance "
                            "callbacks (coroutine functions need the AsyncConsumer)")  # fmt: skip

    def invoke(self, callback: RebalanceCallback, parts: set[TopicPartition]) -> None:
        callback(parts)

    def start(self) -> None:
        if self._closed:
            return
        if self._thread is not None and self._thread.is_alive() and not self._stopping.is_set():
            return
        self._stopping = threading.Event()  # a thread finishing its last request keeps its own
        self._thread = threading.Thread(
            target=self._run, args=(self._stopping, self._client()), daemon=True,
            name=f"eos-heartbeat-{self._member.group_id}",
        )  # fmt: skip
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def wait_changed(self, timeout_s: float) -> None:
        self._changed.clear()
        if self._member.has_work():
            return
        self._changed.wait(max(0.0, timeout_s))

    def stop(self) -> None:
        """No heartbeats from now on (until ``start``); a heartbeat under way ends, its
        answer still taken in."""
        self._stopping.set()
        self._wake.set()

    def leave(self) -> None:
        body = self._member.leave()
        if body is None:
            return
        try:
            self._send(self._client(), body, self._config.retry.coordinator_timeout_ms / 1000)
        except Exception as exc:
            log.info("group %s: leave failed (%r); the session will end it", self._member.group_id,
                     exc)  # fmt: skip

    def commit(self, body: dict[str, Any], timeout_s: float | None) -> Any:
        """A member's offsets, through the group's coordinator (which checks the member)."""
        group, http = self._member.group_id, self._client()
        return http.call(
            Req.OFFSET_COMMIT, "POST", group_path(group, "offsets"),
            base=lambda: self._coordinator(http), json=body, timeout_s=timeout_s,
            invalidate=lambda exc: self._metadata.invalidate_group_coordinator(group, exc),
        )  # fmt: skip

    def close(self) -> None:
        self._closed = True
        self.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(THREAD_JOIN_S)
        if self._http is not None:
            self._http.close()

    # --- the loop ------------------------------------------------------------------------

    def _client(self) -> SyncTransport:
        with self._http_lock:
            if self._http is None:
                config = self._config
                self._http = SyncTransport(config.retry, transport=self._transport,
                    headers=config.headers, token=config.token, ca_file=config.ca_file,
                )  # fmt: skip
                self._http.on_unreachable = self._metadata.unreachable
            return self._http

    def _run(self, stopping: threading.Event, http: SyncTransport) -> None:
        while not stopping.is_set():
            try:
                self._step(stopping, http)
            except Exception:
                log.exception("group %s: heartbeat loop failed", self._member.group_id)
                stopping.wait(LOOP_PAUSE_S)

    def _step(self, stopping: threading.Event, http: SyncTransport) -> None:
        delay = self._member.next_heartbeat()
        if delay is None or delay > 0:
            self._wake.clear()
            if stopping.is_set():
                return
            delay = self._member.next_heartbeat()
            if delay is None or delay > 0:
                self._wake.wait(delay)
            return
        beat = self._member.begin_heartbeat()
        if beat is None:
            return
        try:
            body = self._send(http, beat.body, self._member.call_timeout_s())
            changed = self._member.on_answer(beat, body)
        except Exception as exc:
            changed = self._member.on_error(beat, exc)
        if changed:
            self._changed.set()

    def _send(self, http: SyncTransport, body: dict[str, Any], timeout_s: float) -> Any:
        group = self._member.group_id
        return http.call(
            Req.GROUP_HEARTBEAT, "POST", group_path(group, "heartbeat"),
            base=lambda: self._coordinator(http), json=body, timeout_s=timeout_s,
            attempt_s=_attempt_s(self._config, body),
            invalidate=lambda exc: self._metadata.invalidate_group_coordinator(group, exc),
        )  # fmt: skip

    def _coordinator(self, http: SyncTransport) -> str:
        group = self._member.group_id
        url = self._metadata.group_coordinator(group)
        if url is None:
            body = http.call(
                Req.FIND_COORDINATOR, "GET", "/v1/coordinators",
                base=lambda: http.bootstrap(self._metadata), params=_find_params(self._member),
                timeout_s=self._config.retry.coordinator_timeout_ms / 1000,
            )  # fmt: skip
            self._metadata.set_group_coordinator(group, str(body["url"]))
            url = str(body["url"]).rstrip("/")
        return url


__all__ = ["AsyncHeartbeat", "AsyncRebalanceCallback", "Heartbeat", "RebalanceCallback"]
