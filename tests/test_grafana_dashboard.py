"""The Grafana dashboard (docs/grafana/eos-dashboard.json) uses only metrics, and labels,
that the services export: scraped from a real coordinator and a real storage node. Its
consumer groups row is checked on its own too, against the coordinator's metrics registry,
so a renamed group metric fails a unit test first."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator_service.metrics import CoordinatorMetrics
from sdk import Consumer, TopicPartition, TransactionalProducer
from tests.sdk.helpers import wait_for
from tests.support.cluster import ClusterFactory

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "eos-dashboard.json"
METRIC = re.compile(r"\beos_[a-z_]+\b")
BY = re.compile(r"\bby \(([^)]*)\)")
#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def exported(text: str) -> dict[str, set[str]]:
    """Metric name -> label names, from a Prometheus exposition (families with no sample
    yet count too, with no labels known)."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            found.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            labels = re.findall(r'(\w+)="', rest.split("}")[0]) if rest else []
            found.setdefault(name.split()[0], set()).update(labels)
    return found


def problems(dashboard: dict[str, Any], metrics: dict[str, set[str]]) -> list[str]:
    """Every metric a query names that is not exported, and every ``by (label)`` that no
    metric of the query carries."""
    found = []
    for expr in queries(dashboard):
        names = METRIC.findall(expr)
        for name in names:
            if name not in metrics:
                found.append(f"{name} is not exported ({expr})")
        carried = set().union(*(metrics.get(n, set()) for n in names)) | TARGET_LABELS
        for group in BY.findall(expr):
            for label in (x.strip() for x in group.split(",")):
                if label and label not in carried:
                    found.append(f"label {label} is on no metric of {expr}")
    return found


@pytest.mark.unit
def test_the_checker_finds_a_planted_unknown_metric_and_label() -> None:
    dashboard = {"panels": [{"targets": [
        {"expr": "sum by (code) (rate(eos_node_errors_total[1m]))"},
        {"expr": "rate(eos_node_made_up_total[1m])"},
        {"expr": "sum by (colour) (eos_node_lso_lag)"},
    ]}]}
    metrics = {"eos_node_errors_total": {"code"}, "eos_node_lso_lag": {"topic"}}
    found = problems(dashboard, metrics)
    assert len(found) == 2
    assert "eos_node_made_up_total is not exported" in found[0]
    assert "label colour" in found[1]


@pytest.mark.unit
def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert len(queries(dashboard)) >= 20
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row titled ``title``, up to the next row."""
    panels = dashboard["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    under = []
    for panel in panels[start + 1:]:
        if panel["type"] == "row":
            break
        under.append(panel)
    return under


GROUP_METRICS = {"eos_coordinator_group_members", "eos_coordinator_groups",
                 "eos_coordinator_group_rebalances_total", "eos_coordinator_group_lag"}


@pytest.mark.unit
def test_the_consumer_groups_row_queries_the_coordinators_group_metrics() -> None:
    """Members, rebalances and lag per group, each from a metric the coordinator's registry
    has (the lag with its ``group`` label once a group has a sample)."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = row_panels(dashboard, "Consumer groups")
    assert len(panels) == 3
    named = {name for p in panels for t in p["targets"] for name in METRIC.findall(t["expr"])}
    assert named == GROUP_METRICS
    assert any("by (group)" in t["expr"] for p in panels for t in p["targets"])
    metrics = CoordinatorMetrics()
    metrics.group_lag.labels(group="g").set(1)
    assert not problems({"panels": panels}, exported(metrics.render().decode()))


def test_every_metric_the_dashboard_uses_is_exported(cluster_factory: ClusterFactory) -> None:
    """Labelled series show their labels once they have a sample: the topic is replicated
    (replica lag), a transaction is committed and one aborted, the topic read
    read_committed, one error answered first, and a consumer group joined (its lag is
    sampled every second here)."""
    cluster = cluster_factory(replication_factor=2,
                              coordinator_flags=("--group-lag-interval-ms", "1000"))
    topic = cluster.create_topic(2, "grafana")
    joined = httpx.post(f"{cluster.url}/v1/groups/grafana-{topic}/heartbeat", json={
        "member_epoch": 0, "subscribed_topic_names": [topic], "owned_partitions": [],
    }, timeout=10)  # fmt: skip
    assert joined.status_code == 200, joined.text
    producer = TransactionalProducer(cluster.url, f"grafana-{topic}")
    try:
        producer.init_transactions()
        for commit in (True, False):
            producer.begin_transaction()
            producer.send(topic, "v", partition=0)
            producer.commit_transaction() if commit else producer.abort_transaction()
    finally:
        producer.close()
    with Consumer(cluster.url, isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), 0)
        wait_for(lambda: consumer.poll(timeout=0.5), timeout=20, what="the committed record")
    for node in cluster.nodes:  # an error answer on every node: OFFSET_OUT_OF_RANGE or not ours
        httpx.get(f"{node.url}/v1/partitions/{topic}/0/records", params={"offset": 10**9},
                  timeout=10)  # fmt: skip
    dashboard = json.loads(DASHBOARD.read_text())
    urls = [cluster.coordinators[0].url, *(node.url for node in cluster.nodes)]

    def scraped() -> dict[str, set[str]]:
        metrics: dict[str, set[str]] = {}
        for url in urls:
            for metric, labels in exported(httpx.get(f"{url}/metrics", timeout=10).text).items():
                metrics.setdefault(metric, set()).update(labels)
        return metrics

    # A follower's lag appears once its leader has taken the replica set from the
    # controller's push: scraped again until every labelled series is there.
    with contextlib.suppress(AssertionError):  # the assertion below says what is missing
        wait_for(lambda: not problems(dashboard, scraped()), timeout=20)
    missing = problems(dashboard, scraped())
    assert not missing, missing
