"""``format("eos")``: EOS as a Spark data source, read and written as Spark reads Kafka.

Built on PySpark 4's Python Data Source API, split the way Spark's Kafka connector is:

* ``options``      the option names (Kafka's where they mean the same), checked once;
* ``records``      the Kafka source's columns on read, the Kafka sink's on write;
* ``planning``     the driver's read plan: topics, offsets bounded by the LSO, slices;
* ``batch_read``   ``spark.read``: planned slices, pushed filters, the task's fetch loop;
* ``stream_read``  ``spark.readStream``: micro-batch offsets, admission control;
* ``task_write``   the tasks' writes: deterministic batches in a slot of their own;
* ``batch_write``  ``df.write``: the DataFrame in one transaction owned by the driver;
* ``stream_write`` ``df.writeStream``: one transaction per micro-batch, exactly once;
* ``source``       the provider and ``register(spark)``.

See ``docs/spark.md`` for the options table and the exactly-once argument.
"""

from spark_jobs.datasource.options import EosOptionError
from spark_jobs.datasource.source import EosDataSource, register

__all__ = ["EosDataSource", "EosOptionError", "register"]
