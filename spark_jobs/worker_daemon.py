"""PySpark's worker daemon with the EOS modules imported before it forks.

Spark starts Python work through a daemon (``pyspark.daemon``) that forks one process per
worker, and each fork then imports what its task needs: a ``format("eos")`` task imported
the SDK, pydantic and httpx again in every Python worker. Imported once here, before the
daemon's first fork, every worker inherits them.

Only modules that start no thread when imported belong here: a fork copies the importing
thread alone (that is why ``pyspark.daemon`` itself leaves pandas and pyarrow to the
workers). ``build_session`` names this module (``spark.python.daemon.module``) for local
masters, whose executors run this interpreter; a cluster's executors keep Spark's own
daemon unless told otherwise.
"""

from __future__ import annotations

import threading

# imported for the forks that follow: the worker's own loop, the data source's tasks and
# the batch job's
import pyspark.daemon
import pyspark.worker

import spark_jobs.datasource.batch_read
import spark_jobs.datasource.batch_write
import spark_jobs.datasource.stream_read
import spark_jobs.datasource.stream_write
import spark_jobs.datasource.task_write
import spark_jobs.eos_pipeline  # noqa: F401  (for the forks, as above)


def main() -> None:
    if threading.active_count() != 1:  # an import above started a thread: fork without it
        raise RuntimeError("spark_jobs.worker_daemon: a preloaded module started a thread")
    pyspark.daemon.manager()


if __name__ == "__main__":
    main()
