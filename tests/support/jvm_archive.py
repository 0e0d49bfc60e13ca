"""A class-data-sharing archive of Spark's classes for the JVMs the tests start.

Most of what a test's Spark driver does with its CPU is loading and verifying the same
few thousand classes from Spark's jars, again in every JVM: about 11 CPU-seconds of the
machine for a session and two small queries, 7 with the classes mapped from an archive
(measured with a local session, ``-XX:TieredStopAtLevel=1``). The suite starts about
fifteen of them, on two cores that its other tests need too.

``scripts/test.sh`` makes the archive while ruff, mypy and the first tests run (``python -m
tests.support.jvm_archive PATH``): one JVM runs what the tests run, a batch query, a
Python data source and a stateful streaming query, and writes the classes it loaded at
its exit (``-XX:ArchiveClassesAtExit``, JDK 13 and later). ``tests/conftest.py`` then puts
``-XX:SharedArchiveFile`` in the tests' ``JAVA_TOOL_OPTIONS``. A JVM
whose class path or JDK differs from the archive's (a standalone worker, a container) maps
nothing and runs as before: CDS checks that itself, and its messages are switched off so
that no test reads them in a child's output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

#: For every JVM the tests start (Spark drivers, spark-submit, standalone masters and
#: workers): the client compiler only and one GC thread. A test's JVM lives for seconds on
#: small data, where the optimising compiler's threads are most of its CPU: measured on the
#: driver-kill test (four drivers), 113 CPU-seconds of the machine before, 84 after.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Where ``scripts/test.sh`` writes it: beside the interpreter the tests run, so that a
#: new virtualenv (a new PySpark, new jars) never meets an old archive.
DEFAULT_PATH = Path(sys.prefix) / "spark-classes.jsa"

#: The JVM's own messages about the archive (a class path that differs, a class it cannot
#: archive) are written to stdout; nothing here depends on them.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_WORKLOAD = r"""
import tempfile
import time
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.functions import col, window

class Numbers(DataSource):
    @classmethod
    def name(cls):
        return "numbers"
    def schema(self):
        return "n long"
    def reader(self, schema):
        return NumbersReader()

class NumbersReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(0), InputPartition(1)]
    def read(self, partition):
        for n in range(100):
            yield (n,)

spark = (SparkSession.builder.master("local[2]").appName("jvm-archive")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.dataSource.register(Numbers)
spark.read.format("numbers").load().groupBy((col("n") % 3).alias("k")).count().collect()
spark.createDataFrame([(1, "a")], ["x", "y"]).write.mode("overwrite").parquet(
    tempfile.mkdtemp() + "/p")
stream = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
          .withWatermark("timestamp", "1 second")
          .groupBy(window("timestamp", "1 second")).count())
query = (stream.writeStream.format("memory").queryName("counts").outputMode("update")
         .option("checkpointLocation", tempfile.mkdtemp())
         .trigger(processingTime="500 milliseconds")
         .start())
deadline = time.monotonic() + 120
while len(query.recentProgress) < 3 and time.monotonic() < deadline:
    time.sleep(0.2)
query.stop()
spark.stop()
"""


#: Set by ``scripts/test.sh`` while it makes the archive beside the first tests.
PENDING_ENV = "EOS_TEST_JVM_ARCHIVE"


def jvm_options(base: str, archive: Path = DEFAULT_PATH) -> str:
    """``base`` with the archive's options added when the archive exists or is being
    made: a JVM started before the file is there runs without sharing, one started after
    maps it (it appears at once, renamed into place)."""
    if not archive.is_file() and os.environ.get(PENDING_ENV) != "pending":
        return base
    return f"{base} -XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"


def make(archive: Path, base_options: str) -> bool:
    """Write the archive (atomically: a JVM never maps a half-written one); False, with
    the reason on stderr, when the JVM could not make it (the tests then run without)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=archive.parent)) / archive.name
    env = {
        **os.environ,
        "JAVA_TOOL_OPTIONS": f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}",
        "PYSPARK_PYTHON": sys.executable,
    }
    done = subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    try:
        if done.returncode != 0 or not partial.is_file():
            print(f"jvm_archive: no archive (exit {done.returncode}):\n{done.stderr[-3000:]}",
                  file=sys.stderr)  # fmt: skip
            return False
        partial.replace(archive)
        return True
    finally:
        partial.unlink(missing_ok=True)
        partial.parent.rmdir()


if __name__ == "__main__":
    # stopped by the test script: the exception kills the JVM's driver with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    sys.exit(0 if make(target, TEST_JVM_OPTIONS) else 1)
