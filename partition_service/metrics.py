"""Prometheus metrics of a storage node (docs/design.md §6: rates, LSO lag, open transactions).

Counters are updated on the request path; per-partition gauges are computed at scrape time
from the registry, so they cost nothing between scrapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from partition_service.registry import PartitionRegistry


class NodeMetrics:
    def __init__(self, registry: PartitionRegistry) -> None:
        self.prometheus = CollectorRegistry()
        self.produced_records = Counter(
            "eos_node_produced_records_total",
            "Records appended.",
            ["topic"],
            registry=self.prometheus,
        )
        self.duplicate_batches = Counter(
            "eos_node_duplicate_batches_total",
            "Batches recognised as retries.",
            registry=self.prometheus,
        )
        self.fetched_records = Counter(
            "eos_node_fetched_records_total",
            "Records served.",
            ["isolation_level"],
            registry=self.prometheus,
        )
        self.markers = Counter(
            "eos_node_markers_total",
            "Transaction markers written.",
            ["result"],
            registry=self.prometheus,
        )
        self.errors = Counter(
            "eos_node_errors_total", "Error answers by code.", ["code"], registry=self.prometheus
        )
        self.deleted_segments = Counter(
            "eos_node_retention_deleted_segments_total",
            "Closed segments deleted by retention, compaction or a leader's log start.",
            ["topic"],
            registry=self.prometheus,
        )
        self.deleted_bytes = Counter(
            "eos_node_retention_deleted_bytes_total",
            "Bytes of the segments deleted by retention, compaction or a leader's log start.",
            ["topic"],
            registry=self.prometheus,
        )
        self.compacted_copies = Counter(
            "eos_node_compaction_copied_records_total",
            "Committed offsets copied forward by compaction of __consumer_offsets.",
            ["topic"],
            registry=self.prometheus,
        )
        self.known_coordinators = Gauge(
            "eos_node_known_coordinators",
            "Coordinator instances this node can fall over to (configured and learned); "
            "1 means that one instance is a single point of failure for this node.",
            registry=self.prometheus,
        )
        self.prometheus.register(_PartitionCollector(registry))

    def forget_topic(self, topic: str) -> None:
        """Drop the per-topic series of a topic deleted here: a deleted topic's counters
        would be scraped forever, and a topic created again under its name would go on
        from them. (The per-partition gauges are read from the registry at each scrape,
        so a deleted partition's are gone with it.)"""
        for counter in (self.produced_records, self.deleted_segments, self.deleted_bytes,
                        self.compacted_copies):  # fmt: skip
            with contextlib.suppress(KeyError):  # never counted here
                counter.remove(topic)

    def render(self) -> bytes:
        return generate_latest(self.prometheus)


class _PartitionCollector(Collector):
    def __init__(self, registry: PartitionRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        hw = GaugeMetricFamily("eos_node_high_watermark", "High watermark.", labels=labels)
        lso = GaugeMetricFamily("eos_node_last_stable_offset", "Last stable offset.", labels=labels)
        lag = GaugeMetricFamily(
            "eos_node_lso_lag", "High watermark minus last stable offset.", labels=labels
        )
        open_txns = GaugeMetricFamily(
            "eos_node_open_transactions", "Transactions open on the partition.", labels=labels
        )
        fsyncs = GaugeMetricFamily("eos_node_fsyncs", "Group-commit fsyncs so far.", labels=labels)
        leader = GaugeMetricFamily(
            "eos_node_partition_leader", "1 while this node leads the partition.", labels=labels
        )
        under = GaugeMetricFamily(
            "eos_node_under_replicated",
            "1 while this node leads the partition with fewer in-sync replicas than replicas.",
            labels=labels,
        )
        isr = GaugeMetricFamily(
            "eos_node_in_sync_replicas", "In-sync replicas, as the leader sees them.",
            labels=labels,
        )  # fmt: skip
        log_start = GaugeMetricFamily(
            "eos_node_log_start_offset", "First offset still in the log.", labels=labels
        )
        log_bytes = GaugeMetricFamily(
            "eos_node_log_size_bytes", "Bytes of the partition's segments.", labels=labels
        )
        replica_lag = GaugeMetricFamily(
            "eos_node_replica_lag",
            "Offsets a follower is behind this leader's log end (per follower).",
            labels=[*labels, "replica"],
        )
        for (topic, index), partition in list(self.registry.partitions.items()):
            engine = partition.engine
            key = [topic, str(index)]
            hw.add_metric(key, engine.high_watermark)
            log_start.add_metric(key, engine.log_start_offset)
            log_bytes.add_metric(key, sum(s.size for s in engine.log.segments))
            lso.add_metric(key, engine.last_stable_offset)
            lag.add_metric(key, engine.high_watermark - engine.last_stable_offset)
            open_txns.add_metric(key, len(engine.producers.open_transactions))
            fsyncs.add_metric(key, partition.committer.fsyncs)
            role = partition.role
            leader.add_metric(key, 1 if role.leads else 0)
            view = role.leader
            if view is not None:
                under.add_metric(key, 1 if len(view.isr) < len(view.replicas) else 0)
                isr.add_metric(key, len(view.isr))
                for replica, progress in view.followers.items():
                    behind = max(engine.log_end_offset - progress.log_end_offset, 0)
                    replica_lag.add_metric([*key, str(replica)], behind)
        yield from (hw, lso, lag, open_txns, fsyncs, leader, under, isr, replica_lag, log_start,
                    log_bytes)  # fmt: skip
