"""The options of ``format("eos")``: read once on the driver, checked, then frozen.

Spark hands a data source its options as a case-insensitive map of strings, and calls the
source on the driver (to plan) and again in every task (to read or write). Everything a
task needs is therefore parsed here, on the driver, into frozen dataclasses that travel
with the reader or writer: a wrong name or value fails the query once, before any task
starts, with an ``EosOptionError`` naming the option, and never in the middle of a write.

Names follow Spark's Kafka source and sink where they mean the same thing (``subscribe``,
``startingOffsets``, ``maxRecordsPerTrigger``, ``failOnDataLoss`` ...); the table in
``docs/spark.md`` sets them side by side. Names Kafka has no equivalent for
(``transactionalIdPrefix``, ``mode``) are EOS's own.

The connection options (``bootstrap``, ``token``, ``tlsCaFile``) become a ``Connection``,
which builds the SDK clients and ``spark_jobs._wire`` clients with the same credentials in
the driver and in the tasks. Without ``token``/``tlsCaFile`` the clients fall back to the
SDK's ``EOS_TOKEN``/``EOS_CA_FILE`` variables, as the pipeline's tasks do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from eos_protocol.addresses import AddressError, parse_url_list
from sdk import AdminClient
from sdk._transport import SyncTransport

EARLIEST = -2
LATEST = -1

#: Options Spark itself adds to a source's or sink's map; never the user's mistake.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

_CONNECTION = {"bootstrap", "token", "tlscafile"}
_SOURCE = {
    "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "maxrecordspertrigger", "maxbytespertrigger", "failondataloss", "isolationlevel",
    "minpartitions", "maxoffsetspertask", "fetchmaxrecords",
}  # fmt: skip
_SINK = {
    "topic", "mode", "transactionalid", "transactionalidprefix", "transactiontimeoutms",
    "batchrecords", "batchbytes", "sortwithintask", "writeonce", "sendoffsets",
    "sendoffsetsgroupid",
}  # fmt: skip

_Client = TypeVar("_Client")


class EosOptionError(ValueError):
    """An option of ``format("eos")`` is unknown, missing or has a bad value, or names a
    topic that does not exist. Raised on the driver, before any task runs."""


@dataclass(frozen=True)
class Connection:
    """Where the cluster is and how to authenticate (the same in driver and tasks)."""

    bootstrap: str
    token: str | None = None
    ca_file: str | None = None

    def admin(self) -> AdminClient:
        return AdminClient(self.bootstrap, token=self.token, ca_file=self.ca_file)

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """On the driver, before planning: one coordinator of ``bootstrap`` answers
        (any HTTP answer: a refusal of credentials is the real calls' to report), else
        ``EosOptionError`` naming every address and why it did not answer, at once
        rather than after the SDK's retries (a minute) with no address named."""
        import httpx

        failures = []
        verify: Any = self.ca_file if self.ca_file else True
        for url in [u.strip().rstrip("/") for u in self.bootstrap.split(",") if u.strip()]:
            try:
                httpx.get(f"{url}/readyz", timeout=timeout_s, verify=verify)
                return
            except httpx.HTTPError as exc:
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
        raise EosOptionError("no coordinator of bootstrap answered: " + "; ".join(failures))

    def secure(self, client: _Client) -> _Client:
        """A ``spark_jobs._wire`` client given this connection's token and CA bundle (its
        own transport reads only the environment's)."""
        if self.token is None and self.ca_file is None:
            return client
        old: SyncTransport = client.http  # type: ignore[attr-defined]
        new = SyncTransport(old.retry, token=self.token, ca_file=self.ca_file)
        new.on_unreachable = old.on_unreachable
        old.close()
        client.http = new  # type: ignore[attr-defined]
        return client


@dataclass(frozen=True)
class SourceOptions:
    """What to read. Offsets specs are ``None`` (the default), ``earliest``, ``latest``
    or a per-partition map with -2 for earliest and -1 for latest."""

    connection: Connection
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
    starting: str | dict[str, dict[int, int]] | None = None
    ending: str | dict[str, dict[int, int]] | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    read_committed: bool = True
    min_partitions: int | None = None
    max_offsets_per_task: int = 1_000_000
    fetch_max_records: int = 10_000


@dataclass(frozen=True)
class SinkOptions:
    """How to write. ``exactly_once`` is the default mode; ``at_least_once`` writes each
    task idempotently without a transaction (the benchmark's baseline)."""

    connection: Connection
    topic: str | None = None
    exactly_once: bool = True
    transactional_id: str | None = None
    transactional_id_prefix: str | None = None
    transaction_timeout_ms: int = 120_000
    batch_records: int = 5_000
    batch_bytes: int = 1024 * 1024
    sort_within_task: bool = True
    write_once: bool = False
    #: Source offsets committed for ``send_offsets_group_id`` in the write's transaction
    #: (a batch consume-transform-produce job: the output and its input's offsets at once).
    send_offsets: Mapping[str, Mapping[int, int]] | None = None
    send_offsets_group_id: str | None = None


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_names(given: dict[str, str], allowed: set[str], role: str) -> None:
    unknown = sorted(set(given) - allowed - SPARK_OPTIONS)
    if unknown:
        raise EosOptionError(
            f"unknown option(s) for the eos {role}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(allowed))})"
        )


def _int(given: dict[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    text = given.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise EosOptionError(f"option {name}: {text!r} is not an integer") from None
    if value < minimum:
        raise EosOptionError(f"option {name}: {value} is below {minimum}")
    return value


def _bool(given: dict[str, str], name: str, default: bool) -> bool:
    text = given.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise EosOptionError(f"option {name}: {text!r} is not true or false")


def connection(options: Mapping[str, str]) -> Connection:
    given = _lower(options)
    bootstrap = given.get("bootstrap")
    if not bootstrap:
        raise EosOptionError("option bootstrap (a comma list of coordinator URLs) is required")
    try:
        urls = parse_url_list(bootstrap, "bootstrap")
    except AddressError as exc:
        raise EosOptionError(f"option bootstrap: {exc}") from None
    return Connection(",".join(urls), given.get("token") or None, given.get("tlscafile") or None)


def _offsets_spec(given: dict[str, str], name: str) -> str | dict[str, dict[int, int]] | None:
    text = given.get(name.lower())
    if text is None:
        return None
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    try:
        parsed = json.loads(text)
        spec = {
            str(topic): {int(p): int(o) for p, o in parts.items()}
            for topic, parts in parsed.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise EosOptionError(
            f'option {name}: {text!r} is not earliest, latest or JSON like {{"t": {{"0": 23}}}}'
        ) from None
    for topic, parts in spec.items():
        for p, o in parts.items():
            if p < 0 or o < EARLIEST:
                raise EosOptionError(f"option {name}: {topic}-{p} at {o} is not an offset")
    return spec


def _assign(given: dict[str, str]) -> dict[str, tuple[int, ...]] | None:
    text = given.get("assign")
    if text is None:
        return None
    try:
        parsed = json.loads(text)
        assign = {str(t): tuple(sorted({int(p) for p in ps})) for t, ps in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise EosOptionError(f'option assign: {text!r} is not JSON like {{"t": [0, 1]}}') from None
    if not assign or any(p < 0 for ps in assign.values() for p in ps):
        raise EosOptionError(f"option assign: {text!r} names no valid partition")
    return assign


def _send_offsets(
    given: dict[str, str], *, streaming: bool, exactly_once: bool
) -> tuple[dict[str, dict[int, int]] | None, str | None]:
    """``sendOffsets`` (JSON like ``startingOffsets``, offsets only) and the group they
    are committed for, ``sendOffsetsGroupId``: both or neither, exactly-once batch only."""
    group = given.get("sendoffsetsgroupid") or None
    spec = _offsets_spec(given, "sendOffsets")
    if (spec is None) != (group is None):
        raise EosOptionError("options sendOffsets and sendOffsetsGroupId go together")
    if spec is None:
        return None, None
    if streaming or not exactly_once:
        raise EosOptionError(
            "option sendOffsets is for exactly-once batch writes (a stream's offsets are "
            "in its checkpoint)"
        )
    if not isinstance(spec, dict) or any(
        o < 0 for parts in spec.values() for o in parts.values()
    ):
        raise EosOptionError(
            'option sendOffsets: give the next offset to read per partition, JSON like '
            '{"t": {"0": 23}}'
        )
    return spec, group


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The reader's options, checked; ``streaming`` refuses ``endingOffsets`` (as Kafka)."""
    given = _lower(options)
    _check_names(given, _CONNECTION | _SOURCE, "source")
    chosen = [name for name in ("subscribe", "subscribepattern", "assign") if name in given]
    if len(chosen) != 1:
        raise EosOptionError(
            "give exactly one of subscribe, subscribePattern, assign"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    subscribe = tuple(t.strip() for t in given.get("subscribe", "").split(",") if t.strip())
    if "subscribe" in given and not subscribe:
        raise EosOptionError("option subscribe: no topic named")
    pattern = given.get("subscribepattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise EosOptionError(f"option subscribePattern: {exc}") from None
    if streaming and "endingoffsets" in given:
        raise EosOptionError("option endingOffsets is for batch reads only")
    level = given.get("isolationlevel", "read_committed").lower()
    if level not in ("read_committed", "read_uncommitted"):
        raise EosOptionError(f"option isolationLevel: {level!r} is not read_committed or "
                             "read_uncommitted")  # fmt: skip
    ending = _offsets_spec(given, "endingOffsets")
    if isinstance(ending, dict) and any(
        o == EARLIEST for parts in ending.values() for o in parts.values()
    ):
        raise EosOptionError("option endingOffsets: -2 (earliest) is not an end")
    return SourceOptions(
        connection=connection(options),
        subscribe=subscribe,
        pattern=pattern,
        assign=_assign(given),
        starting=_offsets_spec(given, "startingOffsets"),
        ending=ending,
        max_records_per_trigger=_int(given, "maxRecordsPerTrigger", None),
        max_bytes_per_trigger=_int(given, "maxBytesPerTrigger", None),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
        read_committed=level == "read_committed",
        min_partitions=_int(given, "minPartitions", None),
        max_offsets_per_task=_int(given, "maxOffsetsPerTask", 1_000_000) or 1_000_000,
        fetch_max_records=_int(given, "fetchMaxRecords", 10_000) or 10_000,
    )


def sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """The writer's options, checked. A streaming exactly-once sink needs
    ``transactionalIdPrefix``: it names the query's transactions and the record of its
    last committed micro-batch, so it must stay the same across restarts of the query."""
    given = _lower(options)
    _check_names(given, _CONNECTION | _SINK, "sink")
    mode = given.get("mode", "exactly_once").lower()
    if mode not in ("exactly_once", "at_least_once"):
        raise EosOptionError(f"option mode: {mode!r} is not exactly_once or at_least_once")
    prefix = given.get("transactionalidprefix")
    if streaming and mode == "exactly_once" and not prefix:
        raise EosOptionError(
            "option transactionalIdPrefix is required for an exactly-once streaming write: "
            "it must be the same on every restart of the query (and unique to it)"
        )
    if streaming and "transactionalid" in given:
        raise EosOptionError("option transactionalId is for batch writes; "
                             "a stream takes transactionalIdPrefix")  # fmt: skip
    write_once = _bool(given, "writeOnce", False)
    if write_once and (streaming or mode != "exactly_once" or not given.get("transactionalid")):
        raise EosOptionError("option writeOnce is for exactly-once batch writes and needs "
                             "transactionalId (in foreachBatch: one per batch id)")  # fmt: skip
    send_offsets, group = _send_offsets(
        given, streaming=streaming, exactly_once=mode == "exactly_once"
    )
    return SinkOptions(
        connection=connection(options),
        topic=given.get("topic") or None,
        exactly_once=mode == "exactly_once",
        transactional_id=given.get("transactionalid") or None,
        transactional_id_prefix=prefix or None,
        transaction_timeout_ms=_int(given, "transactionTimeoutMs", 120_000) or 120_000,
        batch_records=_int(given, "batchRecords", 5_000) or 5_000,
        batch_bytes=_int(given, "batchBytes", 1024 * 1024) or 1024 * 1024,
        sort_within_task=_bool(given, "sortWithinTask", True),
        write_once=write_once,
        send_offsets=send_offsets,
        send_offsets_group_id=group,
    )

