"""The coordinator's tables, as SQLAlchemy Core objects for building statements.

The schema itself is created and changed only by the Alembic migrations in
``migrations/versions``; these definitions must match them (a test compares the two). Core
rather than the ORM: every write here is a single conditional statement whose WHERE clause
carries the lease check, which the unit-of-work model would only get in the way of.

Times are integer milliseconds since the epoch, read from the injected clocks, so a fake
clock drives timeouts and lease expiry in tests exactly as wall time does in production.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

cluster = sa.Table(
    "cluster",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("cluster_id", sa.String(64), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

# One row per coordinator process ever started: gives each a small integer (the node_id of
# FindCoordinator answers) without asking operators to number them.
coordinator_instances = sa.Table(
    "coordinator_instances",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("instance_id", sa.String(64), nullable=False, unique=True),
    sa.Column("url", sa.String(512), nullable=False),
    sa.Column("started_ms", sa.BigInteger, nullable=False),
    # written every lease round: the instances alive now are those with a recent heartbeat
    sa.Column("heartbeat_ms", sa.BigInteger, nullable=False, server_default="0"),
)

#: The ``leases`` row of the controller (the instance that runs elections); the
#: transaction-log partitions are the rows from 0.
CONTROLLER_LEASE = -1

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("log_partition", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("owner", sa.String(64), nullable=True),
    sa.Column("owner_url", sa.String(512), nullable=True),
    sa.Column("owner_node_id", sa.Integer, nullable=True),
    sa.Column("coordinator_epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("expires_at_ms", sa.BigInteger, nullable=False, server_default="0"),
)

producer_id_blocks = sa.Table(
    "producer_id_blocks",
    metadata,
    sa.Column("block_start", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("block_end", sa.BigInteger, nullable=False),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("allocated_ms", sa.BigInteger, nullable=False),
)

topics = sa.Table(
    "topics",
    metadata,
    sa.Column("name", sa.String(249), primary_key=True),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("internal", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("replication_factor", sa.Integer, nullable=False, server_default="1"),
    sa.Column("min_insync_replicas", sa.Integer, nullable=False, server_default="1"),
    sa.Column("unclean_leader_election", sa.Boolean, nullable=False, server_default=sa.false()),
    # -1: unlimited (migration 0006); a topic created without them gets the defaults
    sa.Column("retention_ms", sa.BigInteger, nullable=False, server_default="-1"),
    sa.Column("retention_bytes", sa.BigInteger, nullable=False, server_default="-1"),
)

# The partition state the controller keeps (docs/design.md §7). ``node_id`` is the leader,
# -1 when none is alive; ``replicas``, ``isr`` and ``created_replicas`` are JSON lists of
# node ids. Leader and ISR change only by a compare-and-set on ``partition_epoch``.
topic_partitions = sa.Table(
    "topic_partitions",
    metadata,
    sa.Column("topic", sa.String(249), sa.ForeignKey("topics.name"), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("node_id", sa.Integer, nullable=False),
    sa.Column("created_on_node", sa.Boolean, nullable=False, server_default=sa.false()),
    # set when the node refused the partition (not when it was unreachable)
    sa.Column("creation_error", sa.Text, nullable=True),
    # "[]" (a row an older version wrote) reads as [node_id]
    sa.Column("replicas", sa.Text, nullable=False, server_default="[]"),
    sa.Column("isr", sa.Text, nullable=False, server_default="[]"),
    sa.Column("leader_epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("partition_epoch", sa.Integer, nullable=False, server_default="0"),
    # the replicas that have created the partition; created_on_node once all have
    sa.Column("created_replicas", sa.Text, nullable=False, server_default="[]"),
)

# Deleted topics whose replicas a storage node has not yet confirmed removing: a row per
# (topic, node). The name cannot be created again while a row of it is left
# (controller/topic_deletion.py).
topic_deletions = sa.Table(
    "topic_deletions",
    metadata,
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("deleted_ms", sa.BigInteger, nullable=False),
    sa.Column("partitions", sa.Integer, nullable=False),
)

# When each storage node was last heard from: a node is alive while its heartbeat is
# younger than node_session_timeout_ms (the controller's clock).
node_heartbeats = sa.Table(
    "node_heartbeats",
    metadata,
    sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("heartbeat_ms", sa.BigInteger, nullable=False),
    # Made anew at every start of the node: a change means the node restarted.
    sa.Column("incarnation", sa.String(64), nullable=True),
)

transactions = sa.Table(
    "transactions",
    metadata,
    sa.Column("transactional_id", sa.String(249), primary_key=True),
    sa.Column("txn_log_partition", sa.Integer, nullable=False, index=True),
    sa.Column("producer_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("producer_epoch", sa.Integer, nullable=False),
    sa.Column("last_producer_id", sa.BigInteger, nullable=False),
    sa.Column("last_producer_epoch", sa.Integer, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("timeout_ms", sa.Integer, nullable=False),
    sa.Column("txn_start_ms", sa.BigInteger, nullable=True),
    sa.Column("last_update_ms", sa.BigInteger, nullable=False),
    # [[topic, partition], ...] and [group, ...], as JSON text (portable to SQLite).
    sa.Column("partitions", sa.Text, nullable=False),
    sa.Column("groups", sa.Text, nullable=False),
    sa.Column("coordinator_epoch", sa.Integer, nullable=False),
    # 1: the client adds partitions; 2: the nodes do, and every end bumps the epoch
    sa.Column("transaction_version", sa.Integer, nullable=False, server_default="1"),
    # a version-2 end that exhausted the epoch: the id the client continues with (-1: none)
    sa.Column(
        "next_producer_id", sa.BigInteger, nullable=False, server_default="-1", index=True
    ),
)

# One row per ACL binding (eos_protocol/acl.py); the unique constraint makes creating the
# same binding twice harmless.
acls = sa.Table(
    "acls",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("principal", sa.String(140), nullable=False),
    sa.Column("resource_type", sa.String(32), nullable=False),
    sa.Column("resource_name", sa.String(249), nullable=False),
    sa.Column("pattern_type", sa.String(16), nullable=False),
    sa.Column("operation", sa.String(16), nullable=False),
    sa.Column("permission", sa.String(8), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.UniqueConstraint(
        "principal", "resource_type", "resource_name", "pattern_type", "operation",
        "permission", name="uq_acls_binding",
    ),
)

# --- consumer groups (KIP-848): membership and assignment, owned by lease ----------------
# A group belongs to the transaction log partition its id hashes to, so the instance that
# holds that lease is its group coordinator. Every write is fenced by that lease, as
# transaction writes are. Sets of partitions are JSON text ([[topic, partition], ...]).
consumer_groups = sa.Table(
    "consumer_groups",
    metadata,
    sa.Column("group_id", sa.String(249), primary_key=True),
    sa.Column("lease_partition", sa.Integer, nullable=False, index=True),
    sa.Column("group_epoch", sa.Integer, nullable=False),
    sa.Column("assignment_epoch", sa.Integer, nullable=False),
    # {topic: partition count} the target assignment was computed for
    sa.Column("subscribed_metadata", sa.Text, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
)

group_members = sa.Table(
    "group_members",
    metadata,
    sa.Column("group_id", sa.String(249), primary_key=True),
    sa.Column("member_id", sa.String(64), primary_key=True),
    sa.Column("instance_id", sa.String(249), nullable=True),
    sa.Column("rack_id", sa.String(249), nullable=True),
    sa.Column("client_host", sa.String(255), nullable=True),
    sa.Column("member_epoch", sa.Integer, nullable=False),
    sa.Column("previous_member_epoch", sa.Integer, nullable=False),
    sa.Column("rebalance_timeout_ms", sa.Integer, nullable=False),
    sa.Column("subscribed_topic_names", sa.Text, nullable=False),
    sa.Column("subscribed_topic_regex", sa.Text, nullable=True),
    sa.Column("assigned", sa.Text, nullable=False),
    sa.Column("pending_revocation", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
)

# What a transaction's AddOffsetsToTxn claimed for a group member (KIP-447): checked again
# when the transaction commits, so a member fenced in between cannot commit its offsets.
group_txn_claims = sa.Table(
    "group_txn_claims",
    metadata,
    sa.Column("transactional_id", sa.String(249), primary_key=True),
    sa.Column("group_id", sa.String(249), primary_key=True),
    sa.Column("producer_id", sa.BigInteger, nullable=False),
    sa.Column("txn_start_ms", sa.BigInteger, nullable=False),
    sa.Column("member_id", sa.String(64), nullable=False),
    sa.Column("member_epoch", sa.Integer, nullable=False),
    sa.Column("partitions", sa.Text, nullable=False),
)
