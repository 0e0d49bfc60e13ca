"""Fixtures of the Spark tests: the real cluster shared by the session (a coordinator on
SQLite and three storage nodes verifying transactional batches with it, every topic with
three replicas: the pipeline runs on replicated partitions, acks=all), and one local
SparkSession per test module.

The session's master is ``local[2,4]``: two task slots, and a task may fail three times
before its job fails, so a planted fault on a first attempt is retried, as on a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, ClusterFactory, ClusterSpec

pyspark = pytest.importorskip("pyspark")

SPARK_CLUSTER = ClusterSpec(nodes=3, replication_factor=3)
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.python.worker.reuse": "true",
}


@pytest.fixture(scope="session")
def cluster(session_cluster_factory: ClusterFactory) -> Cluster:
    return session_cluster_factory.shared(SPARK_CLUSTER)


def make_spark(**extra: str) -> Any:
    from spark_jobs.eos_pipeline import build_session

    spark = build_session("local[2,4]", "eos-spark-tests", **{**SPARK_CONF, **extra})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = make_spark()
    yield session
    session.stop()
