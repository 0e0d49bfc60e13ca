"""The exactly-once pipeline against a cluster with TLS and ACLs on, run by a principal
holding only the rights the job needs. The driver and the executors get their token and
CA bundle from ``EOS_TOKEN`` / ``EOS_CA_FILE`` (the session hands them to the executors),
so a run that copies every record once proves both reached every task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sdk import AclBinding, AdminClient, Producer
from spark_jobs.check import check_topics, offsets_at_end
from spark_jobs.eos_pipeline import PipelineConfig, run_pipeline
from tests.spark.conftest import make_spark, stop_spark_session
from tests.spark.helpers import tag_to, uid, untag
from tests.support.cluster import Cluster as SecureCluster
from tests.support.cluster import ClusterFactory

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]  # one JVM at a time

RECORDS = 120


@pytest.fixture(scope="module")
def secure(module_cluster_factory: ClusterFactory) -> SecureCluster:
    return module_cluster_factory(database="postgres", auth=True, tls=True)


def _grant_job_rights(cluster: SecureCluster, app: str, source: str, sink: str) -> None:
    def allow(rtype: str, name: str, op: str, pattern: str = "literal") -> AclBinding:
        return AclBinding.model_validate({
            "principal": "User:etl", "resource_type": rtype, "resource_name": name,
            "pattern_type": pattern, "operation": op,
        })

    with AdminClient(cluster.url, token=cluster.tokens["admin"],
                     ca_file=cluster.ca_file) as admin:
        admin.create_topic(source, partitions=2)
        admin.create_topic(sink, partitions=2)
        admin.create_acls([
            allow("topic", source, "read"),
            allow("topic", sink, "write"),
            allow("group", app, "read"),
            allow("transactional_id", f"{app}-", "write", "prefixed"),
        ])


def test_the_pipeline_runs_exactly_once_over_tls_with_least_privilege(
    secure: SecureCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert secure.ca_file is not None
    app, source, sink = uid("app"), uid("in"), uid("out")
    _grant_job_rights(secure, app, source, sink)
    values = [str(i) for i in range(RECORDS)]
    with Producer(secure.url, token=secure.tokens["admin"], ca_file=secure.ca_file) as producer:
        for value in values:
            producer.send(source, value, key=f"k{value}")
        producer.flush()

    monkeypatch.setenv("EOS_TOKEN", secure.tokens["etl"])
    monkeypatch.setenv("EOS_CA_FILE", secure.ca_file)
    stop_spark_session()  # the executors' credentials are read when a context starts
    spark: Any = make_spark()
    try:
        conf = spark.sparkContext.getConf()
        assert conf.get("spark.executorEnv.EOS_CA_FILE") == secure.ca_file
        config = PipelineConfig(secure.url, app, source, max_batch_records=50)
        stats = run_pipeline(spark, config, transform=tag_to(sink))
    finally:
        spark.stop()
    assert stats.records_in == RECORDS

    monkeypatch.setenv("EOS_TOKEN", secure.tokens["admin"])
    report = check_topics(secure.url, [sink], values, untag)
    assert report.ok, report
    offsets = offsets_at_end(secure.url, source, config.group_id)
    assert all(committed == end for committed, end in offsets.values()), offsets
