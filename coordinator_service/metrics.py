"""Prometheus metrics of one coordinator instance, on a registry of its own.

A registry per app (not the process-global one) so that several apps in one test process do
not collide. Counters carry totals; the ``*_per_second`` gauges are a convenience for people
reading ``/metrics`` by eye and are computed over the last ten seconds at scrape time.
Gauges that describe the current state (open transactions, marker queue, consumer group
members) are set just before each scrape by ``refresh`` and ``refresh_groups``, from what the
instance holds in memory. The one number that needs the storage nodes, each group's lag, is
sampled by a loop of its own (``groups/lag_sampler.py``) and only read here: a scrape must
not wait on a node.

The background loops (partition reconciler, marker channel, expiry scan, ACL refresh, lease
round) report here the entries they had to set aside — a partition a node refused, a marker
no node can take, a record that fails every time — so one poisoned entry is visible on
``/metrics`` while the loop goes on with the others. The app's lifespan hands each loop
this object; a loop built on its own (a test of one part) makes a detached one.
"""

from __future__ import annotations

import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from eos_protocol.states import TransactionState

WINDOW_S = 10.0

#: Background loops that report entries set aside (the ``loop`` label).
LOOPS = (
    "reconciler", "markers", "expiry", "acls", "leases", "controller", "hanging",
    "topic-deletion",
)

class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.commits = Counter(
            "eos_coordinator_commits", "Transactions completed with a commit.", registry=r
        )
        self.aborts = Counter(
            "eos_coordinator_aborts", "Transactions completed with an abort.", registry=r
        )
        self.timeouts = Counter(
            "eos_coordinator_timeouts", "Transactions aborted for exceeding their timeout.",
            registry=r,
        )
        self.transitions = Counter(
            "eos_coordinator_transitions", "Durable state transitions.", ["to"], registry=r
        )
        self.open_transactions = Gauge(
            "eos_coordinator_open_transactions",
            "Transactions Ongoing or Prepare* on this instance.", registry=r,
        )
        self.commit_rate = Gauge(
            "eos_coordinator_commits_per_second", "Commits over the last 10 s.", registry=r
        )
        self.abort_rate = Gauge(
            "eos_coordinator_aborts_per_second", "Aborts over the last 10 s.", registry=r
        )
        self.marker_queue_depth = Gauge(
            "eos_coordinator_marker_queue_depth",
            "Partitions still waiting for a transaction marker.", registry=r,
        )
        self.marker_queue_age = Gauge(
            "eos_coordinator_marker_queue_oldest_age_seconds",
            "Age of the oldest transaction whose markers are not all written.", registry=r,
        )
        self.owned_partitions = Gauge(
            "eos_coordinator_owned_log_partitions",
            "Transaction-log partitions this instance holds the lease of.", registry=r,
        )
        self.lease_handoffs = Counter(
            "eos_coordinator_lease_handoffs",
            "Transaction-log partitions handed over to another instance to even the shares.",
            registry=r,
        )
        self.partitions_not_created = Gauge(
            "eos_coordinator_partitions_not_created",
            "Partitions placed but not yet created on their storage node (refused ones "
            "included), as of the reconciler's last round.", registry=r,
        )
        self.partitions_refused = Gauge(
            "eos_coordinator_partitions_refused",
            "Partitions their storage node refused to create (creation_error is set).",
            registry=r,
        )
        self.partition_refusals = Counter(
            "eos_coordinator_partition_creation_refusals",
            "Times a storage node refused to create a partition (or the coordinator could "
            "not even address it), by node.", ["node"], registry=r,
        )
        self.markers_refused = Counter(
            "eos_coordinator_markers_refused",
            "Markers counted as written although their node refused them or no node can "
            "hold their partition.", registry=r,
        )
        self.set_aside = Counter(
            "eos_coordinator_background_entries_set_aside",
            "Entries a background loop failed on and set aside to go on with the others.",
            ["loop"], registry=r,
        )
        for loop in LOOPS:
            self.set_aside.labels(loop=loop)
        self._replication(r)
        self._hanging(r)
        self._groups(r)
        self._recent: collections.deque[tuple[float, bool]] = collections.deque()

    def _replication(self, r: CollectorRegistry) -> None:
        """The controller's and AlterPartition's metrics (docs/design.md §7)."""
        self.leader_elections = Counter(
            "eos_coordinator_leader_elections",
            "Partition leaders elected by this instance as controller (kind: clean, or "
            "unclean from outside the ISR).", ["kind"], registry=r,
        )
        for kind in ("clean", "unclean"):
            self.leader_elections.labels(kind=kind)
        self.offline_partitions = Gauge(
            "eos_coordinator_offline_partitions",
            "Partitions without a live leader, as of the controller's last round (0 on an "
            "instance that is not the controller).", registry=r,
        )
        self.under_replicated_partitions = Gauge(
            "eos_coordinator_under_replicated_partitions",
            "Partitions with fewer in-sync replicas than replicas, as of the controller's "
            "last round.", registry=r,
        )
        self.isr_shrinks = Counter(
            "eos_coordinator_isr_shrinks",
            "ISR changes that removed replicas (dead nodes, or a leader's AlterPartition).",
            registry=r,
        )
        self.isr_expands = Counter(
            "eos_coordinator_isr_expands",
            "ISR changes that added replicas (a leader's AlterPartition).", registry=r,
        )

    def _hanging(self, r: CollectorRegistry) -> None:
        """The hanging-transaction detector's (coordinator_service/hanging/)."""
        self.hanging_transactions = Gauge(
            "eos_hanging_transactions",
            "Transactions open on a partition that the coordinators cannot end (unknown "
            "producer, not ongoing at the coordinator, partition not added, or older than "
            "the maximum timeout), as of the last pass (0 on an instance that is not the "
            "controller).", registry=r,
        )
        self.hanging_resolved = Counter(
            "eos_hanging_transactions_resolved",
            "Hanging transactions resolved by the detector or an operator (action: abort, "
            "commit, resume_markers, coordinator_abort).", ["action"], registry=r,
        )
        for action in ("abort", "commit", "resume_markers", "coordinator_abort"):
            self.hanging_resolved.labels(action=action)

    def _groups(self, r: CollectorRegistry) -> None:
        """The consumer groups this instance coordinates (coordinator_service/groups/)."""
        self.group_members = Gauge(
            "eos_coordinator_group_members",
            "Members of the consumer groups this instance coordinates (holds the lease of).",
            registry=r,
        )
        self.coordinated_groups = Gauge(
            "eos_coordinator_groups",
            "Consumer groups this instance coordinates (on record, members or not).",
            registry=r,
        )
        self.group_rebalances = Counter(
            "eos_coordinator_group_rebalances",
            "New target assignments computed for a group (each move of a group epoch the "
            "assignor answered) on this instance.", registry=r,
        )
        self.group_lag = Gauge(
            "eos_coordinator_group_lag",
            "Records a coordinated group has yet to read, summed over its partitions "
            "against the last stable offset, as of the lag sampler's last successful "
            "sample (no series while the group's lag is unknown).", ["group"], registry=r,
        )
        self._rebalances_seen = 0

    def transition(self, _old: TransactionState | None, new: TransactionState) -> None:
        self.transitions.labels(to=new.value).inc()
        if new is TransactionState.COMPLETE_COMMIT:
            self.commits.inc()
            self._recent.append((time.monotonic(), True))
        elif new is TransactionState.COMPLETE_ABORT:
            self.aborts.inc()
            self._recent.append((time.monotonic(), False))

    def refresh(
        self, *, open_transactions: int, queue_depth: int, oldest_ms: int, owned: int
    ) -> None:
        horizon = time.monotonic() - WINDOW_S
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        commits = sum(1 for _, committed in self._recent if committed)
        self.commit_rate.set(commits / WINDOW_S)
        self.abort_rate.set((len(self._recent) - commits) / WINDOW_S)
        self.open_transactions.set(open_transactions)
        self.marker_queue_depth.set(queue_depth)
        self.marker_queue_age.set(oldest_ms / 1000)
        self.owned_partitions.set(owned)

    def refresh_groups(self, *, members: int, groups: int, rebalances: int) -> None:
        """Set the group gauges, and move the rebalance counter on to ``rebalances`` (the
        group coordinator's running count, which only grows while the app runs)."""
        self.group_members.set(members)
        self.coordinated_groups.set(groups)
        if rebalances > self._rebalances_seen:
            self.group_rebalances.inc(rebalances - self._rebalances_seen)
        self._rebalances_seen = rebalances

    def render(self) -> bytes:
        return generate_latest(self.registry)
