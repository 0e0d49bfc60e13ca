"""Everyday commands: topics, produce, consume, transactions, producers.

Each command talks to a running cluster through the SDK, like any other client. A failure
prints the server's code and message on one line (no traceback) and exits non-zero.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from eos_protocol.states import TransactionState
from sdk import AdminClient, ClientError, Consumer, EosError, Producer, TransactionalProducer

P = ParamSpec("P")
T = TypeVar("T")

out = Console()
err = Console(stderr=True)

Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap", "-b", envvar="EOS_BOOTSTRAP",
        help="Coordinator URLs, comma-separated: any live one will do.",
    ),
]
DEFAULT_BOOTSTRAP = "http://127.0.0.1:8080"
RetentionMsOption = Annotated[
    int | None,
    typer.Option("--retention-ms", min=-1,
                 help="How long records are kept, -1 for ever (default: the coordinator's)."),
]  # fmt: skip
RetentionBytesOption = Annotated[
    int | None,
    typer.Option("--retention-bytes", min=-1,
                 help="Largest size of each partition, -1 without limit (default: the "
                 "coordinator's)."),
]  # fmt: skip


def reports_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn the SDK's errors into one line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except EosError as exc:
            err.print(f"[red]error[/red] {exc.code}: {exc.message}", highlight=False)
        except ClientError as exc:
            err.print(f"[red]error[/red] {type(exc).__name__}: {exc}", highlight=False)
        except ValueError as exc:
            err.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(1)

    return wrapper


topics = typer.Typer(
    help="Create, alter, delete, list and describe topics.", no_args_is_help=True
)
transactions = typer.Typer(help="List, describe and abort transactions.", no_args_is_help=True)
producers = typer.Typer(help="Producers with state on a partition.", no_args_is_help=True)


@topics.command("create")
@reports_errors
def topics_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = 1,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor", "-r", min=1,
            help="Copies of each partition on distinct nodes (default: the coordinator's).",
        ),
    ] = None,
    min_insync_replicas: Annotated[
        int | None,
        typer.Option(
            "--min-insync-replicas", min=1,
            help="In-sync replicas an acks=all produce needs (default: min(2, RF)).",
        ),
    ] = None,
    unclean_leader_election: Annotated[
        bool,
        typer.Option(
            "--unclean-leader-election",
            help="Let a replica outside the ISR lead when no in-sync one is alive.",
        ),
    ] = False,
    retention_ms: RetentionMsOption = None,
    retention_bytes: RetentionBytesOption = None,
    exist_ok: Annotated[bool, typer.Option("--exist-ok")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Create a topic; its partitions are placed round-robin on the storage nodes."""
    with AdminClient(bootstrap) as admin:
        info = admin.create_topic(
            name, partitions=partitions, replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            unclean_leader_election=unclean_leader_election, retention_ms=retention_ms,
            retention_bytes=retention_bytes, exist_ok=exist_ok,
        )
    out.print(
        f"created {info.name} with {len(info.partitions)} partitions, replication factor "
        f"{info.replication_factor}, min.insync.replicas {info.min_insync_replicas}, "
        f"{_retention(info.retention_ms, info.retention_bytes)}"
    )


@topics.command("alter")
@reports_errors
def topics_alter(
    name: str,
    retention_ms: RetentionMsOption = None,
    retention_bytes: RetentionBytesOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Change a topic's retention; what is not given is kept."""
    if retention_ms is None and retention_bytes is None:
        raise ValueError("nothing to change: give --retention-ms or --retention-bytes")
    with AdminClient(bootstrap) as admin:
        info = admin.alter_topic(name, retention_ms=retention_ms, retention_bytes=retention_bytes)
    out.print(f"altered {info.name}: {_retention(info.retention_ms, info.retention_bytes)}")


@topics.command("delete")
@reports_errors
def topics_delete(
    name: str,
    missing_ok: Annotated[
        bool, typer.Option("--missing-ok", help="A topic that does not exist is no error.")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete a topic and every record in it (needs delete on the topic). It is gone at
    once; the storage nodes remove its replicas within seconds, and the name can be
    created again once they have."""
    with AdminClient(bootstrap) as admin:
        deleted = admin.delete_topic(name, missing_ok=missing_ok)
    if deleted is None:
        out.print(f"{name} does not exist: nothing to delete")
        return
    out.print(
        f"deleted {deleted.name} ({deleted.partitions} partitions); storage nodes "
        f"{', '.join(map(str, deleted.pending_nodes)) or 'none'} remove its replicas"
    )


def _retention(ms: int, size: int) -> str:
    kept = "for ever" if ms < 0 else f"{ms} ms"
    limit = "no size limit" if size < 0 else f"at most {size} bytes per partition"
    return f"records kept {kept}, {limit}"


@topics.command("list")
@reports_errors
def topics_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Every topic with its partition count."""
    with AdminClient(bootstrap) as admin:
        cluster = admin.describe_cluster()
    table = Table("topic", "partitions")
    for topic in sorted(cluster.topics, key=lambda t: t.name):
        table.add_row(topic.name, str(len(topic.partitions)))
    out.print(table)


@topics.command("describe")
@reports_errors
def topics_describe(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Partitions of a topic: leader, replicas, ISR, leader epoch, log start, high
    watermark, last stable offset; under-replicated partitions are marked."""
    with AdminClient(bootstrap) as admin:
        info = admin.describe_topic(name)
        table = Table(
            "partition", "leader", "replicas", "isr", "leader epoch", "log start",
            "high watermark", "last stable",
            title=f"{info.name}: replication factor {info.replication_factor}, "
            f"min.insync.replicas {info.min_insync_replicas}, "
            f"{_retention(info.retention_ms, info.retention_bytes)}",
        )
        for p in info.partitions:
            if p.leader.node_id < 0:
                leader, offsets = "none alive", None
            else:
                leader = f"{p.leader.node_id} {p.leader.url}"
                offsets = admin.list_offsets((name, p.partition))
            isr = ",".join(map(str, p.isr))
            table.add_row(
                str(p.partition),
                leader,
                ",".join(map(str, p.replicas)),
                f"{isr} (under-replicated)" if p.under_replicated else isr,
                str(p.leader_epoch),
                *(
                    ("-", "-", "-") if offsets is None else (
                        str(offsets.log_start_offset),
                        str(offsets.high_watermark),
                        str(offsets.last_stable_offset),
                    )
                ),
            )
    out.print(table)


def produce(
    topic: str,
    key: Annotated[str | None, typer.Option(help="Key of every record.")] = None,
    partition: Annotated[int | None, typer.Option(help="Partition (default: partitioner).")] = None,
    transactional_id: Annotated[
        str | None,
        typer.Option("--transactional-id", help="Send every line in one transaction."),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Send each line of standard input as one record (idempotent, or in one transaction)."""
    _produce(topic, key, partition, transactional_id, bootstrap)


@reports_errors
def _produce(
    topic: str,
    key: str | None,
    partition: int | None,
    transactional_id: str | None,
    bootstrap: str,
) -> None:
    lines = [line.rstrip("\n") for line in sys.stdin]
    if transactional_id:
        with TransactionalProducer(bootstrap, transactional_id) as producer:
            producer.init_transactions()
            with producer.transaction():
                for line in lines:
                    producer.send(topic, line, key=key, partition=partition)
        out.print(f"committed {len(lines)} records to {topic} in one transaction")
        return
    with Producer(bootstrap) as plain:
        futures = [plain.send(topic, line, key=key, partition=partition) for line in lines]
        plain.flush()
        for future in futures:
            future.result()
    out.print(f"sent {len(lines)} records to {topic}")


def consume(
    topic: str,
    isolation: Annotated[
        str, typer.Option(help="read_committed or read_uncommitted")
    ] = "read_committed",
    from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
    group: Annotated[str | None, typer.Option(help="Consumer group (commits offsets).")] = None,
    max_records: Annotated[int | None, typer.Option(help="Stop after this many records.")] = None,
    idle_timeout: Annotated[
        float | None, typer.Option(help="Stop after this many seconds without records.")
    ] = None,
    show_offsets: Annotated[bool, typer.Option("--show-offsets")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Print the records of a topic, one value per line (all partitions)."""
    _consume(
        topic, isolation, from_beginning, group, max_records, idle_timeout, show_offsets, bootstrap
    )


@reports_errors
def _consume(
    topic: str,
    isolation: str,
    from_beginning: bool,
    group: str | None,
    max_records: int | None,
    idle_timeout: float | None,
    show_offsets: bool,
    bootstrap: str,
) -> None:
    with AdminClient(bootstrap) as admin:
        info = admin.describe_topic(topic)
    reset = "earliest" if from_beginning else "latest"
    count = 0
    with Consumer(bootstrap, group, isolation_level=isolation, auto_offset_reset=reset) as c:
        c.assign([(topic, p.partition) for p in info.partitions])
        last_record = time.monotonic()
        while max_records is None or count < max_records:
            records = c.poll(timeout=0.5)
            for record in records:
                value = record.value if isinstance(record.value, str) else repr(record.value)
                prefix = f"{record.partition}:{record.offset}\t" if show_offsets else ""
                print(f"{prefix}{value}", flush=True)
                count += 1
                if max_records is not None and count >= max_records:
                    break
            if records:
                last_record = time.monotonic()
                if group:
                    c.commit()
            elif idle_timeout is not None and time.monotonic() - last_record > idle_timeout:
                break


@transactions.command("list")
@reports_errors
def transactions_list(
    state: Annotated[str | None, typer.Option(help="Only this state (e.g. Ongoing).")] = None,
    min_duration_ms: Annotated[int | None, typer.Option(min=0)] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Transactional ids known to the coordinators (ListTransactions)."""
    wanted = TransactionState(state) if state else None
    with AdminClient(bootstrap) as admin:
        listing = admin.list_transactions(state=wanted, min_duration_ms=min_duration_ms)
    table = Table("transactional id", "producer id", "state", "duration ms")
    for txn in listing:
        duration = "" if txn.duration_ms is None else str(txn.duration_ms)
        table.add_row(txn.transactional_id, str(txn.producer_id), txn.state.value, duration)
    out.print(table)


@transactions.command("describe")
@reports_errors
def transactions_describe(transactional_id: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """One transactional id: producer, epoch, state, partitions, groups."""
    with AdminClient(bootstrap) as admin:
        txn = admin.describe_transaction(transactional_id)
    _print_mapping(txn.model_dump(mode="json"))


@transactions.command("abort")
@reports_errors
def transactions_abort(transactional_id: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Force-abort a hanging transaction and fence its producer (KIP-664)."""
    with AdminClient(bootstrap) as admin:
        state = admin.abort_transaction(transactional_id)
    out.print(f"{transactional_id}: {state.value}")


@producers.command("describe")
@reports_errors
def producers_describe(
    topic: str, partition: int, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP
) -> None:
    """Producers with state on one partition (DescribeProducers)."""
    with AdminClient(bootstrap) as admin:
        found = admin.describe_producers((topic, partition))
    table = Table(
        "producer id", "epoch", "last sequence", "coordinator epoch", "open txn from",
        "open txn age ms",
    )  # fmt: skip
    now = int(time.time() * 1000)
    for p in found:
        start = "" if p.current_txn_start_offset is None else str(p.current_txn_start_offset)
        since = p.current_txn_start_ms
        age = "" if since is None else str(max(0, now - since))
        table.add_row(
            str(p.producer_id),
            str(p.producer_epoch),
            str(p.last_sequence),
            str(p.coordinator_epoch),
            start,
            age,
        )
    out.print(table)


def _print_mapping(values: dict[str, Any]) -> None:
    width = max(len(k) for k in values)
    for name, value in values.items():
        out.print(f"{name:<{width}}  {value}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(topics, name="topics")
    app.add_typer(transactions, name="transactions")
    app.add_typer(producers, name="producers")
    app.command("produce")(produce)
    app.command("consume")(consume)
