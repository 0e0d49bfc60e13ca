# The one image of the project: coordinators, storage nodes and the Spark master/worker
# (so executors have the SDK and the jobs installed) all run from it.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps curl \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=python3

WORKDIR /opt/eos
COPY pyproject.toml README.md ./
COPY sdk ./sdk
COPY partition_service ./partition_service
COPY coordinator_service ./coordinator_service
COPY spark_jobs ./spark_jobs
COPY migrations ./migrations
COPY eos_cli ./eos_cli
COPY eos_security ./eos_security
RUN pip install --no-cache-dir '.[server,spark]'

RUN useradd --create-home --uid 1000 eos && mkdir -p /data && chown eos /data
USER eos
CMD ["eos", "--help"]
