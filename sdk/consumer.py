# Generated from sdk/aio/consumer.py by sdk/_unasync.py: edit that file, not this one.
"""``Consumer``: assign partitions, poll records, commit group offsets (blocking twin).

Partitions are assigned by the application (``assign``), as with Kafka's manual
assignment; the group id only names where committed offsets live. With the default
``read_committed`` a record of an aborted or still open transaction is never returned.
The logic is ``ConsumerCore``'s; this module only does the I/O. Each fetch asks for
more records than a poll returns, and while the application works on a poll's records
the next chunk of each partition with more to read is fetched ahead (``_prefetch``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import httpx

from eos_protocol.errors import OffsetOutOfRangeError
from sdk._config import USE_DEFAULT, ConsumerConfig, RetryConfig, TimeoutArg, resolve_timeout
from sdk._consumer_base import ConsumerCore, decode_records
from sdk._metadata import (
    Bootstrap,
    find_coordinator_params,
    group_path,
    partition_path,
    records_path,
    topic_path,
)
from sdk._prefetch import Prefetcher
from sdk._producer_base import normalise_offsets
from sdk._transport import Req, SyncTransport
from sdk._types import (
    ConsumerRecord,
    OffsetAndMetadata,
    Offsets,
    TopicPartition,
    as_topic_partition,
)

_DEFAULT_TIMEOUT_MS = 30_000

#: A fetch's answer and its records, decoded where it was made.
_Fetched = tuple[dict[str, Any], list[ConsumerRecord]]


class Consumer:
    """Reads records of assigned partitions; ``read_committed`` by default.

    Example::

        with Consumer("http://127.0.0.1:8080", group_id="enricher") as consumer:
            consumer.assign([("orders", 0)])
            for record in consumer.poll(timeout=1.0):
                print(record.offset, record.value)
            consumer.commit()
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
        retry: RetryConfig | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        config = ConsumerConfig(
            bootstrap_url,
            group_id=group_id,
            isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            max_poll_records=max_poll_records,
            fetch_max_wait_ms=fetch_max_wait_ms,
            retry=retry or RetryConfig(),
            headers=headers or {},
            token=token,
            ca_file=ca_file,
        )
        self._core = ConsumerCore(config)
        self._http = SyncTransport(config.retry, transport=transport, headers=config.headers,
            token=config.token, ca_file=config.ca_file,
        )
        self._http.on_unreachable = self._core.metadata.unreachable
        self._ahead: Prefetcher[_Fetched] = Prefetcher()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- assignment and positions --------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions from now on (positions of kept ones stay)."""
        self._core.check_open()
        self._core.assign([as_topic_partition(tp) for tp in partitions])
        self._ahead.forget(self._core.assignment())

    def assignment(self) -> set[TopicPartition]:
        return self._core.assignment()

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``partition`` from ``offset`` at the next poll."""
        self._core.seek(partition, offset)
        self._ahead.drop(as_topic_partition(partition))

    def position(
        self, partition: TopicPartition | tuple[str, int], timeout: TimeoutArg = USE_DEFAULT
    ) -> int:
        """The offset of the next record to read (looked up if not yet known)."""
        if self._core.known_position(partition) is None:
            self._resolve_positions(resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS))
        offset = self._core.known_position(partition)
        assert offset is not None
        return offset

    def _resolve_positions(self, timeout_s: float | None) -> None:
        unknown = self._core.unknown_positions()
        if not unknown:
            return
        committed: dict[TopicPartition, OffsetAndMetadata | None] = {}
        if self._core.config.group_id is not None:
            committed = self.committed(unknown, require_stable=True, timeout=timeout_s)
        for tp in unknown:
            found = committed.get(tp)
            if found is not None:
                self._core.seek(tp, found.offset)
            else:
                self._reset(tp, timeout_s)

    def _reset(self, tp: TopicPartition, timeout_s: float | None) -> None:
        body = self._http.call(
            Req.LIST_OFFSETS,
            "GET",
            partition_path(tp, "offsets"),
            base=lambda: self._leader(tp),
            timeout_s=timeout_s,
            invalidate=lambda _exc: self._core.metadata.invalidate_topic(tp.topic),
        )
        self._core.seek(tp, self._core.reset_offset(body))

    # --- polling -------------------------------------------------------------------------

    def poll(self, timeout: TimeoutArg = USE_DEFAULT) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds (default
        0: take what is there) for at least one; at most ``max_poll_records``."""
        self._core.check_open()
        timeout_s = resolve_timeout(timeout, 0) or 0.0
        deadline = time.monotonic() + timeout_s
        self._resolve_positions(max(timeout_s, _DEFAULT_TIMEOUT_MS / 1000))
        records: list[ConsumerRecord] = []
        first = True
        while True:
            order = self._core.poll_order()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms = self._core.wait_for_round(first, remaining_ms, len(order))
            for tp in order:
                room = self._core.config.max_poll_records - len(records)
                if room <= 0:
                    break
                if not self._core.has_buffered(tp):
                    self._fill(tp, wait_ms)
                records.extend(self._core.take(tp, room))
                self._fetch_ahead(tp)
            first = False
            if records or time.monotonic() >= deadline or not order:
                return records

    def _fill(self, tp: TopicPartition, wait_ms: int) -> None:
        """Fill ``tp``'s buffer: with the fetch made ahead from its offset if there is
        one (and it succeeded), else with a fetch now."""
        offset = self._core.fetch_offset(tp)
        assert offset is not None
        ahead = self._ahead.take(tp, offset)
        if ahead is not None:
            fetched = self._ahead.wait(ahead)
            if fetched is not None and self._core.on_fetch(tp, offset, *fetched):
                return
        params = self._core.fetch_params(tp, self._core.fetch_records(), wait_ms)
        try:
            body, records = self._fetch(tp, params)
        except OffsetOutOfRangeError:
            self._reset(tp, _DEFAULT_TIMEOUT_MS / 1000)
            return
        self._core.on_fetch(tp, int(params["offset"]), body, records)

    def _fetch_ahead(self, tp: TopicPartition) -> None:
        """Start fetching ``tp``'s next chunks if the node had more at its last answer."""
        while True:
            offset = self._core.ahead_offset(
                tp, self._ahead.count(tp), self._ahead.last_offset(tp)
            )
            if offset is None:
                return
            self._start_ahead(tp, offset)

    def _start_ahead(self, tp: TopicPartition, offset: int) -> None:
        params = self._core.fetch_params(tp, self._core.fetch_records(), 0, offset)
        self._ahead.start(tp, offset, lambda: self._fetch(tp, params))

    def _fetch(self, tp: TopicPartition, params: dict[str, Any]) -> _Fetched:
        """One fetch and its records (decoded here, so a fetch ahead decodes ahead too)."""
        body = self._http.call(
            Req.FETCH,
            "GET",
            records_path(tp),
            base=lambda: self._leader(tp),
            params=params,
            timeout_s=_DEFAULT_TIMEOUT_MS / 1000,
            invalidate=lambda _exc: self._core.metadata.invalidate_topic(tp.topic),
        )
        return body, decode_records(tp, body)

    # --- group offsets -------------------------------------------------------------------

    def commit(
        self,
        offsets: Offsets | None = None,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> None:
        """Commit ``offsets`` (default: the current positions) for the consumer group."""
        group = self._core.require_group()
        wanted = None if offsets is None else normalise_offsets(offsets)
        body = self._core.commit_body(wanted)
        if not body["offsets"]:
            return
        self._group_call(Req.OFFSET_COMMIT, "POST", group, body=body, timeout=timeout)

    def committed(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        require_stable: bool = True,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets. With ``require_stable`` (the default) it waits
        while a transaction holds pending offsets for the group, so the answer never
        precedes an outcome (KIP-447)."""
        group = self._core.require_group()
        answer = self._group_call(
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

    def _group_call(
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
        return self._http.call(
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

    def _bootstrap(self) -> str:
        return self._http.bootstrap(self._core.metadata)

    def _leader(self, tp: TopicPartition) -> str:
        url = self._core.metadata.leader(tp)
        if url is None:
            body = self._http.call(
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

    def _group_node(self, group: str) -> str:
        url = self._core.metadata.group_node(group)
        if url is None:
            body = self._http.call(
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

    def close(self) -> None:
        if not self._core.closed:
            self._core.closed = True
            self._ahead.close()
            self._http.close()
