"""Fixtures of the Spark tests: the real cluster shared by the session (a coordinator on
SQLite and three storage nodes verifying transactional batches with it, every topic with
three replicas: the pipeline runs on replicated partitions, acks=all; a new one for the
next module once it holds many partitions, ``RECYCLE_ABOVE_PARTITIONS``), and one local
SparkSession per worker, shared by the modules (``format("eos")`` registered in it).

A JVM's start costs seconds of both cores, and a minute on a loaded machine: the modules
of a lane share one session, and a module that needs other settings Spark reads only when
its context starts (speculation) asks ``spark_session(**conf)`` for its own, which stops
the shared one; the next module that asks for the plain one starts it again.

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


#: A module starting on a cluster with more partitions than this gets a new cluster
#: (``ClusterFactory.shared``): the Spark modules make topics of their own by the dozen.
RECYCLE_ABOVE_PARTITIONS = 40


@pytest.fixture(scope="module")
def cluster(session_cluster_factory: ClusterFactory) -> Cluster:
    return session_cluster_factory.shared(SPARK_CLUSTER, recycle_above=RECYCLE_ABOVE_PARTITIONS)


def make_spark(**extra: str) -> Any:
    from spark_jobs.eos_pipeline import build_session

    spark = build_session("local[2,4]", "eos-spark-tests", **{**SPARK_CONF, **extra})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: The worker's running session and the settings it was started with.
_running: dict[str, Any] = {}


def spark_session(**extra: str) -> Any:
    """The worker's session with ``extra`` settings: the running one when it has them,
    else a new one (the running one is stopped first: one SparkContext per process)."""
    from spark_jobs.datasource import register

    settings = tuple(sorted(extra.items()))
    if _running.get("settings") == settings:
        return _running["session"]
    stop_spark_session()
    session = make_spark(**extra)
    register(session)
    _running.update(settings=settings, session=session)
    return session


def stop_spark_session() -> None:
    if "session" in _running:
        _running.pop("session").stop()
        _running.pop("settings")


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_the_end() -> Iterator[None]:
    yield
    stop_spark_session()


@pytest.fixture
def spark() -> Any:
    """The worker's plain session (``format("eos")`` registered)."""
    return spark_session()
