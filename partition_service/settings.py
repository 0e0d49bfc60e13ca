"""Settings of a storage node: pydantic-settings read from ``EOS_*`` variables.

Every field is also a flag of ``eos node`` (cli.py builds the flags from this model, help
from each field's description), so an operator can move a value between the environment
and the command line freely, and the two lists cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from eos_protocol.addresses import parse_url_list
from eos_security.settings import SecuritySettings


class NodeSettings(SecuritySettings):
    """One storage node. The defaults are those of docs/storage-node.md's table."""

    model_config = SettingsConfigDict(env_prefix="EOS_", extra="ignore")

    node_id: int = Field(default=1, ge=0, description="This node's id in the cluster.")
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=9091, ge=0, le=65535, description="Port to listen on.")
    data_dir: Path = Field(default=Path("./data/node-1"), description="Where partitions live.")
    coordinator_url: str | None = Field(
        default=None,
        description="Coordinators, comma-separated (http://c1:8080,http://c2:8080): asked "
        "to verify transactional batches and for the ACLs; the node learns the other live "
        "instances from them and falls over between them.",
    )
    learn_coordinators: bool = Field(
        default=True,
        description="Also ask the live coordinators the cluster names, not only those "
        "configured (off when the nodes cannot reach the coordinators' public URLs).",
    )
    coordinator_timeout_ms: int = Field(
        default=2_000,
        ge=10,
        description="How long a coordinator may take to answer before the next one is asked.",
    )
    txn_verification: Literal["coordinator", "off"] = Field(
        default="coordinator",
        description="'off' accepts transactional batches unverified (a node run alone).",
    )
    fsync: bool = Field(
        default=True, description="Acknowledge produces only after fsync (group commit)."
    )
    segment_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=4096,
        le=1024**3,
        description="Size at which a partition's active segment is rolled.",
    )
    index_interval_bytes: int = Field(
        default=4096, ge=64, description="Bytes of records between two offset-index entries."
    )
    checkpoint_interval_ms: int = Field(
        default=5000, ge=10, description="How often the recovery checkpoint is written."
    )
    inline_fsync_under_us: int = Field(
        default=500,
        ge=0,
        le=1_000_000,
        description="A partition's fsync runs on the event loop while its recent fsyncs "
        "took under this many microseconds on average, on a worker thread otherwise "
        "(0: always on a thread). Saves the hand-off where the disk syncs quickly.",
    )
    retention_check_interval_ms: int = Field(
        default=30_000,
        ge=10,
        description="How often each partition's closed segments are checked against its "
        "topic's retention (and __consumer_offsets compacted).",
    )
    producer_expiration_ms: int = Field(
        default=86_400_000,
        ge=1000,
        description="Producers idle this long, with no transaction open, are forgotten at "
        "the next checkpoint.",
    )
    max_record_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="Largest key + value of one record (MESSAGE_TOO_LARGE above).",
    )
    max_request_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest request body."
    )
    group_offset_partitions: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Number of __consumer_offsets partitions (the same on every service).",
    )
    acl_refresh_ms: int = Field(
        default=5_000, ge=100, description="How often the ACLs are fetched from the coordinator."
    )
    heartbeat_interval_ms: int = Field(
        default=500,
        ge=0,
        description="How often the node tells the coordinators it is alive and learns its "
        "partitions' leaders and ISRs (0: never, a node without a controller).",
    )
    controller_session_timeout_ms: int = Field(
        default=3_000,
        ge=100,
        description="With no heartbeat answered for this long, the node stops leading "
        "replicated partitions (the controller has taken it for dead) until one is.",
    )
    replica_lag_time_max_ms: int = Field(
        default=10_000,
        ge=100,
        description="A follower not caught up with the leader for this long leaves the ISR.",
    )
    replica_fetch_wait_max_ms: int = Field(
        default=5_000,
        ge=10,
        le=30_000,
        description="How long a follower's fetch waits at its leader's log end for new "
        "records (a long poll: records are copied as soon as they come). The leader counts "
        "a waiting follower as caught up, so this only sets how often an idle partition's "
        "followers ask again; at most half of replica_lag_time_max_ms is used.",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    log_format: Literal["json", "text"] = Field(
        default="json", description="Structured JSON lines, or text for a terminal."
    )

    @field_validator("coordinator_url")
    @classmethod
    def _coordinators_usable(cls, value: str | None) -> str | None:
        """A list the node could never use is refused at start, not at every produce."""
        if value is None or not value.strip():
            return None
        return ",".join(parse_url_list(value, "URL"))

    @property
    def coordinator_urls(self) -> list[str]:
        return [] if self.coordinator_url is None else self.coordinator_url.split(",")
