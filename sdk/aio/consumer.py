"""``AsyncConsumer``: assign partitions or subscribe, poll records, commit group offsets
(async twin).

Partitions are assigned by the application (``assign``), as with Kafka's manual
assignment, or by the group's coordinator (``subscribe``, KIP-848): the consumer is then
a member of its group, heartbeats in the background (``sdk/_heartbeat.py``) and runs the
rebalance callbacks inside ``poll``, where it takes on and lets go of partitions
(``GroupMember``). With the default ``read_committed`` a record of an aborted or still
open transaction is never returned.
The logic is ``ConsumerCore``'s; this module only does the I/O. Each fetch asks for
more records than a poll returns, and while the application works on a poll's records
the next chunk of each partition with more to read is fetched ahead (``_prefetch``).

Records are read with one request per node and round (``POST /v1/fetch``): a round names
every partition led there that needs records, at its own position, and those worth
fetching ahead. The requests to the nodes run side by side; a poll takes what the first
answers bring and leaves the others' long polls to the next. A node of an earlier
release, which answers 404, is read one partition per request for a while.
"""

# The twins share their signatures, ``timeout=`` included (ruff's ASYNC109 would have the
# async one take ``asyncio.timeout`` instead).
# ruff: noqa: ASYNC109

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

import httpx

from eos_protocol.errors import (
    EosError,
    FencedMemberEpochError,
    NotFoundError,
    OffsetOutOfRangeError,
    UnknownMemberIdError,
)
from eos_protocol.fetch_many import MAX_FETCH_PARTITIONS
from sdk._config import USE_DEFAULT, ConsumerConfig, RetryConfig, TimeoutArg, resolve_timeout
from sdk._consumer_base import FETCH_MANY_PATH, ConsumerCore, NodeAnswer, decode_records
from sdk._group_base import GroupMember
from sdk._heartbeat import AsyncHeartbeat, AsyncRebalanceCallback
from sdk._metadata import (
    Bootstrap,
    find_coordinator_params,
    group_path,
    partition_path,
    records_path,
    topic_path,
)
from sdk._prefetch import AsyncPrefetcher
from sdk._producer_base import normalise_offsets
from sdk._transport import AsyncTransport, Req
from sdk._types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    Offsets,
    TopicPartition,
    as_topic_partition,
)

_DEFAULT_TIMEOUT_MS = 30_000


class AsyncConsumer:
    """Reads records of assigned (or, subscribed, of its group's) partitions;
    ``read_committed`` by default.

    Example::

        async with AsyncConsumer("http://127.0.0.1:8080", group_id="enricher") as consumer:
            consumer.assign([("orders", 0)])
            for record in await consumer.poll(timeout=1.0):
                print(record.offset, record.value)
            await consumer.commit()

    Or as a member of the group, which shares the topic's partitions out::

        consumer.subscribe(["orders"], on_revoked=lambda parts: print("revoked", parts))
        records = await consumer.poll(timeout=1.0)
    """

    def __init__(
        self,
        bootstrap_url: Bootstrap,
        group_id: str | None = None,
        *,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        group_instance_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        retry: RetryConfig | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        config = ConsumerConfig(
            bootstrap_url,
            group_id=group_id,
            isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            max_poll_records=max_poll_records,
            fetch_max_wait_ms=fetch_max_wait_ms,
            group_instance_id=group_instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
            retry=retry or RetryConfig(),
            headers=headers or {},
            token=token,
            ca_file=ca_file,
        )
        self._core = ConsumerCore(config)
        self._http = AsyncTransport(config.retry, transport=transport, headers=config.headers,
            token=config.token, ca_file=config.ca_file,
        )
        self._http.on_unreachable = self._core.metadata.unreachable
        self._ahead: AsyncPrefetcher[NodeAnswer] = AsyncPrefetcher()
        self._group = GroupMember(
            group_id or "", config.retry, instance_id=group_instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )  # fmt: skip
        self._heartbeat = AsyncHeartbeat(self._group, self._core.metadata, config, transport)
        self._on_assigned: AsyncRebalanceCallback | None = None
        self._on_revoked: AsyncRebalanceCallback | None = None
        self._on_lost: AsyncRebalanceCallback | None = None

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- assignment and positions --------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions from now on (positions of kept ones stay).
        ``IllegalStateError`` while subscribed: the group assigns the partitions then."""
        self._core.check_open()
        self._core.assign([as_topic_partition(tp) for tp in partitions])
        self._ahead.forget(self._core.assignment())

    def assignment(self) -> set[TopicPartition]:
        """The partitions read now (subscribed: those the group gave and poll took on)."""
        return self._core.assignment()

    def subscribe(
        self,
        topics: Iterable[str] | None = None,
        *,
        pattern: str | None = None,
        on_assigned: AsyncRebalanceCallback | None = None,
        on_revoked: AsyncRebalanceCallback | None = None,
        on_lost: AsyncRebalanceCallback | None = None,
    ) -> None:
        """Join the group (at the next poll) to read ``topics``, or every topic whose
        whole name matches ``pattern``; the coordinator shares their partitions out among
        the members. Called again, it changes the subscription (and the callbacks).

        The callbacks get a set of partitions and run inside ``poll``, ``unsubscribe`` and
        ``close``: ``on_revoked`` before partitions go to another member (commit their
        offsets there), ``on_assigned`` once new ones were added (their positions are
        the committed offsets, unless the callback seeks), ``on_lost`` when the member was
        fenced and its partitions may be another's already (committing them would fail).
        ``IllegalStateError`` if partitions were assigned by hand, or without a group id.
        """
        self._core.check_open()
        self._core.check_can_subscribe()
        for callback in (on_assigned, on_revoked, on_lost):
            if callback is not None:
                self._heartbeat.check_callback(callback)
        names = [topics] if isinstance(topics, str) else None if topics is None else list(topics)
        self._group.subscribe(names, pattern)
        self._core.subscribed = True
        self._on_assigned, self._on_revoked, self._on_lost = on_assigned, on_revoked, on_lost
        self._heartbeat.wake()

    async def unsubscribe(self) -> None:
        """Leave the group (``on_revoked`` runs first for the partitions read), or drop the
        partitions assigned by hand."""
        self._core.check_open()
        if self._core.subscribed:
            failure = await self._leave_group()
            self._core.subscribed = False
            if failure is not None:
                raise failure
        self._core.assign([])
        self._ahead.forget(())

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The membership the last poll's records were read under, for
        ``send_offsets_to_transaction`` (a fenced member's offsets are refused)."""
        self._core.require_group()
        return self._group.group_metadata()

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``partition`` from ``offset`` at the next poll."""
        self._core.seek(partition, offset)
        self._ahead.drop(as_topic_partition(partition))

    async def position(
        self, partition: TopicPartition | tuple[str, int], timeout: TimeoutArg = USE_DEFAULT
    ) -> int:
        """The offset of the next record to read (looked up if not yet known)."""
        if self._core.known_position(partition) is None:
            await self._resolve_positions(resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS))
        offset = self._core.known_position(partition)
        assert offset is not None
        return offset

    async def _resolve_positions(self, timeout_s: float | None) -> None:
        unknown = self._core.unknown_positions()
        if not unknown:
            return
        committed: dict[TopicPartition, OffsetAndMetadata | None] = {}
        if self._core.config.group_id is not None:
            committed = await self.committed(unknown, require_stable=True, timeout=timeout_s)
        for tp in unknown:
            found = committed.get(tp)
            if found is not None:
                self._core.seek(tp, found.offset)
            else:
                await self._reset(tp, timeout_s)

    async def _reset(self, tp: TopicPartition, timeout_s: float | None) -> None:
        body = await self._http.call(
            Req.LIST_OFFSETS,
            "GET",
            partition_path(tp, "offsets"),
            base=lambda: self._leader(tp),
            timeout_s=timeout_s,
            invalidate=lambda _exc: self._core.metadata.invalidate_topic(tp.topic),
        )
        self._core.seek(tp, self._core.reset_offset(body))

    # --- polling -------------------------------------------------------------------------

    async def poll(self, timeout: TimeoutArg = USE_DEFAULT) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds (default
        0: take what is there) for at least one; at most ``max_poll_records``."""
        self._core.check_open()
        timeout_s = resolve_timeout(timeout, 0) or 0.0
        deadline = time.monotonic() + timeout_s
        records: list[ConsumerRecord] = []
        first = True
        while True:
            if self._core.subscribed:
                await self._rebalance()
            await self._resolve_positions(max(timeout_s, _DEFAULT_TIMEOUT_MS / 1000))
            order = self._core.poll_order()
            if not order and self._core.subscribed and time.monotonic() < deadline:
                await self._heartbeat.wait_changed(deadline - time.monotonic())
                continue  # nothing to read yet: wait for the group to assign some
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms = self._core.wait_for_round(first, remaining_ms)
            sent = await self._send_round(order, wait_ms)
            await self._collect(order, sent if first else [], deadline)
            for tp in order:
                room = self._core.config.max_poll_records - len(records)
                if room <= 0:
                    break
                records.extend(self._core.take(tp, room))
            first = False
            if records or time.monotonic() >= deadline or not order:
                return records

    async def _send_round(self, order: list[TopicPartition], wait_ms: int) -> list[Any]:
        """One request to each node with something to ask (``ConsumerCore.wanted``); the
        handles of those that carry a partition needing records now."""
        now = time.monotonic()
        by_node: dict[str, list[tuple[TopicPartition, int]]] = {}
        needing: set[str] = set()
        for tp in order:
            offset = self._core.wanted(
                tp, now, started=self._ahead.count(tp), last=self._ahead.last_offset(tp),
                pending=self._pending(tp) is not None,
            )  # fmt: skip
            if offset is None:
                continue
            try:
                url = await self._leader(tp)
            except EosError as exc:
                self._failed(tp, exc, now)
                continue
            by_node.setdefault(url, []).append((tp, offset))
            if offset == self._core.fetch_offset(tp) and self._core.needs_records(tp):
                needing.add(url)
        sent: list[Any] = []
        for url, entries in by_node.items():
            wait = wait_ms if url in needing else 0
            if self._core.is_older(url, now):
                sent += self._send_each(url, entries, wait)
                continue
            for at in range(0, len(entries), MAX_FETCH_PARTITIONS):
                chunk = entries[at:at + MAX_FETCH_PARTITIONS]
                body = self._core.fetch_many_body(chunk, wait)
                fetch = functools.partial(self._fetch_many, url, body, [tp for tp, _ in chunk])
                handle = self._ahead.start_many(chunk, fetch)
                if url in needing:
                    sent.append(handle)
        return sent

    def _send_each(
        self, url: str, entries: list[tuple[TopicPartition, int]], wait_ms: int
    ) -> list[Any]:
        """A node of an earlier release: one ``GET .../records`` per partition, the
        round's wait shared among them."""
        share = wait_ms // len(entries)
        sent: list[Any] = []
        for tp, offset in entries:
            params = self._core.fetch_params(tp, self._core.fetch_records(), share, offset)
            fetch = functools.partial(self._fetch_one, url, tp, params)
            sent.append(self._ahead.start_many([(tp, offset)], fetch))
        return sent

    def _pending(self, tp: TopicPartition) -> Any:
        """The fetch of ``tp`` from its fetch offset, under way or answered, if any."""
        offset = self._core.fetch_offset(tp)
        return None if offset is None else self._ahead.peek(tp, offset)

    async def _collect(
        self, order: list[TopicPartition], sent: list[Any], deadline: float
    ) -> None:
        """Wait for the round's answers — all of those ``sent`` (requests that wait for
        nothing), else the first to come of those a partition needs, until ``deadline``
        — then put every answer that came into its partition's buffer."""
        if sent:
            for handle in sent:
                await self._ahead.wait(handle)
        else:
            needed = [h for tp in order if self._core.needs_records(tp)
                      and (h := self._pending(tp)) is not None]  # fmt: skip
            left = deadline - time.monotonic()
            if needed and not any(self._ahead.ready(h) for h in needed):
                await self._ahead.wait_first(needed, left)
            elif not needed and not any(self._core.has_buffered(tp) for tp in order):
                retry_at = self._core.next_retry(time.monotonic())
                pause = left if retry_at is None else min(left, retry_at - time.monotonic())
                await self._ahead.wait_first([], pause)
        for tp in order:
            handle = self._pending(tp)
            if handle is None or not self._core.needs_records(tp) or not self._ahead.ready(handle):
                continue
            offset = self._core.fetch_offset(tp)
            assert offset is not None
            self._ahead.take(tp, offset)
            answer = await self._ahead.wait(handle)
            if answer is not None:
                await self._use(tp, offset, answer)

    async def _use(self, tp: TopicPartition, offset: int, answer: NodeAnswer) -> None:
        """Take ``tp``'s part of a request's answer: its records, or its error."""
        if answer.older:
            self._core.mark_older(answer.url, time.monotonic())
            return  # read per partition from the next round on
        exc = answer.errors.get(tp)
        if exc is None:
            fetched = answer.fetched.get(tp)
            if fetched is not None:
                self._core.on_fetch(tp, offset, *fetched)
            return
        if isinstance(exc, OffsetOutOfRangeError):
            self._ahead.drop(tp)
            await self._reset(tp, _DEFAULT_TIMEOUT_MS / 1000)
            return
        self._failed(tp, exc, time.monotonic())

    def _failed(self, tp: TopicPartition, exc: BaseException, now: float) -> None:
        if self._core.on_fetch_error(tp, exc, now):
            self._core.metadata.invalidate_topic(tp.topic)

    async def _fetch_many(
        self, url: str, body: dict[str, Any], tps: list[TopicPartition]
    ) -> NodeAnswer:
        """One ``POST /v1/fetch`` and its records (decoded here, so a fetch ahead decodes
        ahead too); a failure is each partition's, a 404 says the node is older."""
        answer = NodeAnswer(url)
        try:
            got = await self._http.send_once(
                "POST", url + FETCH_MANY_PATH, json=body,
                timeout_s=self._core.attempt_s(int(body["max_wait_ms"])),
            )  # fmt: skip
        except NotFoundError:
            answer.older = True
            return answer
        except Exception as exc:
            return answer.failed(tps, exc)
        return answer.read(got)

    async def _fetch_one(self, url: str, tp: TopicPartition, params: dict[str, Any]) -> NodeAnswer:
        """One ``GET .../records`` of ``tp`` (a node of an earlier release)."""
        answer = NodeAnswer(url)
        try:
            body = await self._http.send_once(
                "GET", url + records_path(tp), params=params,
                timeout_s=self._core.attempt_s(int(params["max_wait_ms"])),
            )  # fmt: skip
        except Exception as exc:
            return answer.failed([tp], exc)
        answer.fetched[tp] = (body, decode_records(tp, body))
        return answer

    # --- group membership ----------------------------------------------------------------

    async def _rebalance(self) -> None:
        """Apply what the group changed since the last round: lost partitions, then
        revoked ones, then assigned ones, each with its callback. A callback's error is
        raised once the changes are made (Kafka's rule), as is a refused join."""
        self._heartbeat.start()
        error = self._group.take_error()
        if error is not None:
            raise error
        plan = self._group.reconcile()
        failure: BaseException | None = None
        if plan.lost:
            failure = await self._let_go(plan.lost, self._on_lost)
        if plan.revoked:
            failure = await self._let_go(plan.revoked, self._on_revoked) or failure
        if plan.assigned:
            self._core.add_partitions(plan.assigned)
            self._group.acquired(plan.assigned)
            self._heartbeat.wake()
            failure = await self._callback(self._on_assigned, plan.assigned) or failure
        if failure is not None:
            raise failure

    async def _let_go(
        self, parts: frozenset[TopicPartition], callback: AsyncRebalanceCallback | None
    ) -> BaseException | None:
        """Run ``callback`` (the application commits there), then stop reading ``parts``
        and have the next heartbeat say so at once."""
        failure = await self._callback(callback, parts)
        self._core.remove_partitions(parts)
        self._ahead.forget(self._core.assignment())
        self._group.released(parts)
        self._heartbeat.wake()
        return failure

    async def _callback(
        self, callback: AsyncRebalanceCallback | None, parts: frozenset[TopicPartition]
    ) -> BaseException | None:
        if callback is None:
            return None
        try:
            await self._heartbeat.invoke(callback, set(parts))
        except Exception as exc:
            return exc
        return None

    async def _leave_group(self) -> BaseException | None:
        """Let go of everything (its callback first), then leave the group."""
        plan = self._group.release_all()
        failure: BaseException | None = None
        if plan.lost:
            failure = await self._let_go(plan.lost, self._on_lost)
        if plan.revoked:
            failure = await self._let_go(plan.revoked, self._on_revoked) or failure
        await self._heartbeat.stop()
        await self._heartbeat.leave()
        return failure

    # --- group offsets -------------------------------------------------------------------

    async def commit(
        self,
        offsets: Offsets | None = None,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> None:
        """Commit ``offsets`` (default: the current positions) for the consumer group.

        A subscribed consumer commits through the group's coordinator, which refuses a
        member fenced since (``FencedMemberEpochError``, ``UnknownMemberIdError``) or
        offsets of a partition it does not own, so a stalled copy cannot move offsets
        another copy now owns; one that ``assign()``s commits at the offsets node."""
        group = self._core.require_group()
        wanted = None if offsets is None else normalise_offsets(offsets)
        body = self._core.commit_body(wanted)
        if not body["offsets"]:
            return
        if not self._core.subscribed:
            await self._group_call(Req.OFFSET_COMMIT, "POST", group, body=body, timeout=timeout)
            return
        member = self._group.group_metadata()
        if member.member_id is None:
            raise UnknownMemberIdError(
                f"this consumer is not a member of group {group!r} now (joining, or fenced "
                "and not yet joined again): its offsets cannot be committed"
            )
        body |= {"member_id": member.member_id, "member_epoch": member.member_epoch}
        try:
            await self._heartbeat.commit(body, resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS))
        except (FencedMemberEpochError, UnknownMemberIdError):
            self._group.fenced()  # the next poll reports the loss and joins again
            raise

    async def committed(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        require_stable: bool = True,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets. With ``require_stable`` (the default) it waits
        while a transaction holds pending offsets for the group, so the answer never
        precedes an outcome (KIP-447)."""
        group = self._core.require_group()
        answer = await self._group_call(
            Req.OFFSET_FETCH,
            "GET",
            group,
            params={"require_stable": "true" if require_stable else "false"},
            timeout=timeout,
        )
        found = self._core.parse_committed(answer)
        wanted = (
            self._core.assignment()
            if partitions is None
            else {as_topic_partition(tp) for tp in partitions}
        )
        return {tp: found.get(tp) for tp in wanted}

    async def _group_call(
        self,
        req: Req,
        method: str,
        group: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: TimeoutArg,
    ) -> Any:
        action = "offsets"
        return await self._http.call(
            req,
            method,
            group_path(group, action),
            base=lambda: self._group_node(group),
            json=body,
            params=params,
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
            invalidate=lambda _exc: self._core.metadata.invalidate_group(group),
        )

    # --- metadata ------------------------------------------------------------------------

    async def _bootstrap(self) -> str:
        return await self._http.bootstrap(self._core.metadata)

    async def _leader(self, tp: TopicPartition) -> str:
        url = self._core.metadata.leader(tp)
        if url is None:
            body = await self._http.call(
                Req.TOPIC,
                "GET",
                topic_path(tp.topic),
                base=self._bootstrap,
                timeout_s=_DEFAULT_TIMEOUT_MS / 1000,
            )
            self._core.metadata.update_topic(body)
            url = self._core.metadata.leader(tp)
            assert url is not None
        return url

    async def _group_node(self, group: str) -> str:
        url = self._core.metadata.group_node(group)
        if url is None:
            body = await self._http.call(
                Req.FIND_COORDINATOR,
                "GET",
                "/v1/coordinators",
                base=self._bootstrap,
                params=find_coordinator_params(group, "group"),
                timeout_s=_DEFAULT_TIMEOUT_MS / 1000,
            )
            self._core.metadata.set_group_node(group, str(body["url"]))
            url = str(body["url"]).rstrip("/")
        return url

    async def close(self) -> None:
        """Leave the group if subscribed (``on_revoked`` runs first; a static member's
        partitions wait for it until its session ends), then release everything."""
        if self._core.closed:
            return
        failure: BaseException | None = None
        try:
            if self._core.subscribed:
                failure = await self._leave_group()
        finally:
            self._core.closed = True
            await self._heartbeat.aclose()
            await self._ahead.aclose()
            await self._http.aclose()
        if failure is not None:
            raise failure
