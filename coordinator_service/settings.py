"""Settings of a coordinator instance: pydantic-settings read from ``EOS_*`` variables.

Every field is also a flag of ``eos coordinator`` (cli.py builds the flags from this model),
so an operator can move a value between the environment and the command line freely.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from eos_protocol.acl import PRINCIPAL_RE
from eos_protocol.addresses import check_url
from eos_security.settings import SecuritySettings


def parse_nodes(spec: str) -> dict[int, str]:
    """``"1=http://h:9091,2=http://h:9092"`` -> ``{1: "http://h:9091", 2: ...}``."""
    nodes: dict[int, str] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        node_id, sep, url = item.partition("=")
        if not sep or not node_id.strip().isdigit() or not url.strip():
            raise ValueError(f"bad node entry {item!r}: expected ID=URL")
        if int(node_id) in nodes:
            raise ValueError(f"node {int(node_id)} is named twice in --nodes")
        nodes[int(node_id)] = check_url(url, f"storage node {int(node_id)}")
    return nodes


def parse_principals(spec: str) -> list[str]:
    return [item.strip() for item in spec.split(",") if item.strip()]


class CoordinatorSettings(SecuritySettings):
    """One coordinator instance. Defaults follow Kafka where Kafka has one (docs/design.md §5)."""

    model_config = SettingsConfigDict(env_prefix="EOS_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://...). Default: SQLite in the data dir.",
    )
    data_dir: Path = Field(default=Path("data/coordinator"), description="Directory for SQLite.")
    nodes: str = Field(default="", description="Storage nodes: 1=http://host:9091,2=...")
    public_url: str | None = Field(
        default=None, description="URL clients use to reach this instance (NOT_COORDINATOR)."
    )
    instance_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        description="Unique name of this instance (default: a random one at each start).",
    )
    instances: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Coordinator processes to run from this command, on consecutive ports from "
            "--port, sharing the PostgreSQL database and the transaction-log partitions "
            "(one per core uses the whole host)."
        ),
    )
    txn_log_partitions: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Partitions of the transaction log, each leased by one instance; an id "
        "belongs to crc32(transactional_id) % this (the same on every coordinator).",
    )
    group_offset_partitions: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Number of __consumer_offsets partitions (the same on every service).",
    )
    producer_id_block_size: int = Field(
        default=1000, ge=1, description="Producer ids reserved in the database at a time."
    )
    max_transaction_timeout_ms: int = Field(
        default=900_000,
        ge=1,
        description="Largest transaction timeout a producer may ask for "
        "(INVALID_TRANSACTION_TIMEOUT above).",
    )
    transactional_id_expiration_ms: int = Field(
        default=604_800_000,
        ge=1,
        description="Transactional ids idle this long are removed.",
    )
    expiry_scan_interval_ms: int = Field(
        default=10_000,
        ge=1,
        description="How often timed-out transactions and expired ids are looked for.",
    )
    lease_ms: int = Field(
        default=10_000,
        ge=100,
        description="Lease on a transaction-log partition (the failover time).",
    )
    init_wait_ms: int = Field(
        default=2_000, ge=0, description="How long init waits for a fenced abort to complete."
    )
    marker_backoff_max_ms: int = Field(
        default=2_000,
        ge=1,
        description="Longest wait between two attempts to send markers to a node.",
    )
    marker_batch_partitions: int = Field(
        default=1_000, ge=1, description="Most partitions in one marker request to a node."
    )
    state_write_batches: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Batches of transaction-state writes in flight to the database at "
        "once. One gathers the most writes per commit and costs the least CPU; more may "
        "help where the database is a network round trip away.",
    )
    node_timeout_ms: int = Field(
        default=5_000, ge=1, description="How long a storage node may take to answer."
    )
    reconcile_interval_ms: int = Field(
        default=2_000,
        ge=10,
        description="How often partitions not yet created on their node are tried again.",
    )
    default_replication_factor: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Replicas of each partition of a topic created without "
        "replication_factor (and of __consumer_offsets at a cluster's first start, as many "
        "as there are nodes at most).",
    )
    default_retention_ms: int = Field(
        default=604_800_000,
        ge=-1,
        description="How long records of a topic created without retention_ms are kept "
        "(-1: for ever; Kafka's log.retention.ms, 7 days).",
    )
    default_retention_bytes: int = Field(
        default=-1,
        ge=-1,
        description="Largest partition of a topic created without retention_bytes before "
        "its oldest segments are deleted (-1: no limit).",
    )
    node_session_timeout_ms: int = Field(
        default=2_000,
        ge=100,
        description="A storage node whose last heartbeat is older than this is dead: the "
        "controller takes it out of every ISR and elects new leaders where it led.",
    )
    controller_interval_ms: int = Field(
        default=200,
        ge=10,
        description="How often the controller looks for dead nodes (and the controller "
        "lease is looked at).",
    )
    leader_rebalance_interval_ms: int = Field(
        default=30_000,
        ge=0,
        description="How often leadership moves back to each partition's preferred "
        "replica when it is alive and in sync (Kafka's auto leader rebalance; 0: never).",
    )
    metadata_refresh_ms: int = Field(
        default=1_000,
        ge=10,
        description="How often partition leaders are read again from the database (markers "
        "follow leader changes through them).",
    )
    db_pool_size: int = Field(
        default=16, ge=1, description="Database connections (and threads that use them)."
    )
    migrate_on_start: bool = Field(default=True, description="Run alembic upgrade on start.")
    database_wait_ms: int = Field(
        default=120_000,
        ge=0,
        description="How long to wait at start for the database to accept connections.",
    )
    super_users: str = Field(
        default="",
        description="Principals allowed everything without ACLs: User:admin,User:ops.",
    )
    acl_refresh_ms: int = Field(
        default=5_000, ge=100, description="How often the ACLs are read again."
    )
    hanging_scan_interval_ms: int = Field(
        default=30_000,
        ge=10,
        description="How often the storage nodes' open transactions are compared with the "
        "coordinators' state (hanging-transaction detector, KIP-664).",
    )
    hanging_margin_ms: int = Field(
        default=60_000,
        ge=0,
        description="A transaction open on a partition for longer than the maximum "
        "transaction timeout plus this margin is hanging, even if the coordinator knows it.",
    )
    abort_hanging_after_ms: int | None = Field(
        default=None,
        ge=0,
        description="Resolve hanging transactions open for longer than this automatically "
        "(abort marker with a bumped epoch; the COMMIT marker again for committed data). "
        "Unset: only report them.",
    )
    group_session_timeout_ms: int = Field(
        default=45_000, ge=1_000, le=3_600_000,
        description="A consumer group member that sends no heartbeat for this long is "
        "removed and its partitions go to others (Kafka's group.consumer.session.timeout.ms).",
    )
    group_heartbeat_interval_ms: int = Field(
        default=5_000, ge=100, le=600_000,
        description="How often group members heartbeat; a heartbeat with nothing to tell is "
        "held up to this long and answered at once when the member's assignment changes.",
    )
    group_rebalance_timeout_ms: int = Field(
        default=300_000, ge=1_000, le=3_600_000,
        description="How long a member that names none may take to let go of revoked "
        "partitions before it is removed (Kafka's max.poll.interval.ms).",
    )
    group_max_size: int = Field(
        default=2_000, ge=1, le=100_000,
        description="The most members one consumer group may have; a join past it is "
        "refused with GROUP_MAX_SIZE_REACHED.",
    )
    group_lag_interval_ms: int = Field(
        default=30_000, ge=1_000, le=3_600_000,
        description="How often the lag of each group this instance coordinates is read from "
        "the storage nodes for /metrics (eos_coordinator_group_lag); not sampled while "
        "token authentication is on (the coordinator holds no client token to ask with).",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    log_format: Literal["json", "text"] = Field(
        default="json", description="Structured JSON lines, or text for a terminal."
    )

    @model_validator(mode="after")
    def _heartbeats_inside_sessions(self) -> CoordinatorSettings:
        if self.group_heartbeat_interval_ms >= self.group_session_timeout_ms:
            raise ValueError(
                "group_heartbeat_interval_ms must be shorter than group_session_timeout_ms "
                "(members would time out between heartbeats)"
            )
        return self

    @field_validator("nodes")
    @classmethod
    def _nodes_parse(cls, value: str) -> str:
        parse_nodes(value)
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url_usable(cls, value: str | None) -> str | None:
        """Clients and nodes are sent to this URL: it must be one they can use."""
        return None if not value else check_url(value, "URL")

    @field_validator("super_users")
    @classmethod
    def _super_users_parse(cls, value: str) -> str:
        for name in parse_principals(value):
            if not PRINCIPAL_RE.fullmatch(name) or name.endswith(":*"):
                raise ValueError(f"bad super user {name!r}: expected User:name")
        return value

    @property
    def super_user_list(self) -> list[str]:
        return parse_principals(self.super_users)

    @property
    def node_urls(self) -> dict[int, str]:
        return parse_nodes(self.nodes)

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'coordinator.db').resolve()}"

    @property
    def effective_public_url(self) -> str:
        return (self.public_url or f"{self.scheme}://{self.host}:{self.port}").rstrip("/")

    @property
    def lease_renew_interval_ms(self) -> int:
        return max(self.lease_ms // 3, 50)
