# EOS images, built in stages so the images that run hold no compilers, no pip and no
# pip cache:
#
#   target `service` (eos:latest)       coordinators and storage nodes: Python and EOS
#   target `spark`   (eos-spark:latest) Spark master, workers and drivers: the same plus
#                                       Java 17 and PySpark, so executors have the SDK
#
#   docker build --target service -t eos:latest .
#   docker build --target spark -t eos-spark:latest .
#
# The base is pinned to a Debian release (bookworm, Debian 12) rather than to a moving
# tag such as python:3.11-slim: bookworm ships Python 3.11 and OpenJDK 17, which PySpark
# runs on; its successor has no Java 17. Behind a TLS-inspecting proxy, hand its CA to the
# build as a secret (it is never written to a layer):
#
#   docker build --secret id=extra_ca,src=/path/to/proxy-ca.crt ...
ARG DEBIAN_RELEASE=bookworm

# --- the runtime every image starts from --------------------------------------------------
FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /home/eos eos \
 && mkdir -p /data \
 && chown eos:eos /data
ENV PATH=/opt/eos/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# --- requirements: the dependency lists, read out of pyproject.toml. The stages after
# copy these lists, not pyproject.toml, so a change elsewhere in it (the version, the test
# settings) keeps the installed dependencies cached ------------------------------------------
FROM runtime AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["server"]))' > service.txt \
 && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["optional-dependencies"]["spark"]))' > spark.txt

# --- deps: a virtualenv with the services' dependencies, from those lists alone, so
# editing the code does not download them again --------------------------------------------
FROM runtime AS deps
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY --from=requirements /src/service.txt /src/spark.txt ./
RUN python3 -m venv /opt/eos
# The proxy CA, when given, is added to the bundle pip trusts for this step only.
RUN --mount=type=secret,id=extra_ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca > /tmp/ca.pem; \
      export PIP_CERT=/tmp/ca.pem; \
    fi \
 && /opt/eos/bin/pip install --disable-pip-version-check -q "setuptools>=68" wheel \
 && /opt/eos/bin/pip install --disable-pip-version-check -q -r service.txt

FROM deps AS deps-spark
RUN --mount=type=secret,id=extra_ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca > /tmp/ca.pem; \
      export PIP_CERT=/tmp/ca.pem; \
    fi \
 && /opt/eos/bin/pip install --disable-pip-version-check -q -r spark.txt

# --- the source, in one place for both builds ---------------------------------------------
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY sdk /src/sdk
COPY eos_protocol /src/eos_protocol
COPY eos_server /src/eos_server
COPY eos_security /src/eos_security
COPY eos_cli /src/eos_cli
COPY coordinator_service /src/coordinator_service
COPY partition_service /src/partition_service
COPY spark_jobs /src/spark_jobs
COPY migrations /src/migrations
COPY bench /src/bench

# --- build: EOS itself, installed offline (its dependencies are in the virtualenv) under
# a root of its own: /opt/app/opt/eos holds only EOS's files, at the paths they have in
# /opt/eos. The final stages lay them over the dependencies as a layer of their own, so a
# change to the code rebuilds a layer of a few megabytes, not the gigabyte of PySpark ------
FROM deps AS build
COPY --from=source /src /src/project
RUN /opt/eos/bin/pip install --disable-pip-version-check -q --no-deps --no-build-isolation \
      --no-cache-dir --root /opt/app /src/project

# --- the dependencies as the images hold them: pip, setuptools and wheel taken out --------
FROM deps AS venv
RUN /opt/eos/bin/pip uninstall -y -q pip setuptools wheel

FROM deps-spark AS venv-spark
RUN /opt/eos/bin/pip uninstall -y -q pip setuptools wheel

# --- service: coordinators and storage nodes ---------------------------------------------
FROM runtime AS service
COPY --from=venv /opt/eos /opt/eos
COPY --from=build /opt/app/opt/eos/ /opt/eos/
USER eos
WORKDIR /home/eos
EXPOSE 8080 9091
# The service's own readiness: /readyz on EOS_PORT (HTTPS when EOS_TLS_CERT is set).
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=6 CMD ["eos-healthcheck"]
CMD ["eos", "--help"]

# --- spark: Spark master, workers and drivers. From the runtime, not from the service
# image: Java's layer then stays cached while the code changes ------------------------------
FROM runtime AS spark
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
 && mkdir -p /data/spark-work \
 && chown -R eos:eos /data
COPY --from=venv-spark /opt/eos /opt/eos
COPY --from=build /opt/app/opt/eos/ /opt/eos/
WORKDIR /home/eos
ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/opt/eos/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/eos/bin/python \
    SPARK_WORKER_DIR=/data/spark-work \
    SPARK_NO_DAEMONIZE=1
USER eos
EXPOSE 7077 8088 8081 4040
# A master or worker answers on its web UI; compose names the port per role.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=6 \
  CMD ["eos-healthcheck", "--url", "http://127.0.0.1:8088/json/"]
CMD ["spark-submit", "--version"]
