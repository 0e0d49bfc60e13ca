"""The provider of ``format("eos")``: options read once, one reader and one writer each way.

As in Spark's Kafka connector, the provider only validates and dispatches: it turns the
option map into checked option objects (``options``) and hands them to the batch reader,
the stream reader, the batch writer or the stream writer. Each of those methods runs on
the driver, in PySpark's planner, before any task exists, so a bad option, a missing
``value`` column or an unknown topic stops the query there with one ``EosOptionError``.

Registration is one call per SparkSession::

    from spark_jobs.datasource import register
    register(spark)
    df = spark.readStream.format("eos").option("bootstrap", url).option("subscribe", "in").load()

``register`` also turns on ``spark.sql.python.filterPushdown.enabled`` (off by default in
PySpark 4), without which PySpark refuses a reader that takes pushed filters.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from spark_jobs.datasource.batch_read import EosBatchReader
from spark_jobs.datasource.batch_write import EosBatchWriter
from spark_jobs.datasource.options import sink_options, source_options
from spark_jobs.datasource.records import READ_SCHEMA_DDL
from spark_jobs.datasource.stream_read import EosStreamReader
from spark_jobs.datasource.stream_write import EosStreamWriter

#: The session setting PySpark checks before it hands filters to a reader.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class EosDataSource(DataSource):
    """``format("eos")``: batch and streaming reads and writes of an EOS cluster."""

    @classmethod
    def name(cls) -> str:
        return "eos"

    def schema(self) -> str:
        return READ_SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        options = source_options(self.options, streaming=False)
        options.connection.check_reachable()
        return EosBatchReader(options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = source_options(self.options, streaming=True)
        options.connection.check_reachable()
        return EosStreamReader(options)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        options = sink_options(self.options, streaming=False)
        options.connection.check_reachable()
        return EosBatchWriter(options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        options = sink_options(self.options, streaming=True)
        options.connection.check_reachable()
        return EosStreamWriter(options, schema)


def register(spark: Any) -> None:
    """Make ``format("eos")`` known to ``spark`` (and let its reads take pushed filters).

    With ``spark-submit`` or ``pyspark``, ship the project to the executors (``pip install
    eos[spark]`` on every node, or ``--py-files`` with a zip of ``sdk``, ``eos_protocol`` and
    ``spark_jobs``) and call this once after building the session.
    """
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(EosDataSource)
