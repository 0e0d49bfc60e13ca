"""A real run of docker-compose.yml, from the host, the way a user meets it.

Builds the two images, brings the compose project up, waits until every service is
healthy, then through the published ports: creates topics, commits one transaction and
aborts another with the SDK, submits the exactly-once Spark pipeline to the compose Spark
master (driver in the master's container, executors in the worker's), and checks that
every input arrived exactly once. Then it SIGKILLs a storage node's container and starts it
again (the data is intact), takes the project down and up again (the data is kept on the
volumes), and finally down with its volumes (nothing is left). Each step is timed; the
figures go to stdout and, with ``--report``, to a JSON file.

Run by scripts/compose-smoke.sh (which prepares podman first) and by the slow test
tests/deploy/test_compose_run.py. Exit status 0 only if every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = [
    "postgres",
    "coordinator-1",
    "coordinator-2",
    "node-1",
    "node-2",
    "node-3",
    "spark-master",
    "spark-worker",
]
HOST_PORTS = [8080, 8081, 9091, 9092, 9093, 7077, 8088]
INTERNAL_BOOTSTRAP = "http://coordinator-1:8080,http://coordinator-2:8081"
STANDIN = ROOT / "tests" / "deploy" / "postgres-standin"


class SmokeFailure(Exception):
    """A check of the run did not hold."""


@dataclass
class Report:
    figures: dict[str, float] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)

    def timed(self, name: str, started: float) -> float:
        self.figures[name] = round(time.monotonic() - started, 2)
        print(f"[smoke] {name}: {self.figures[name]} s", flush=True)
        return self.figures[name]

    def passed(self, name: str, detail: str) -> None:
        self.checks[name] = detail
        print(f"[smoke] ok  {name}: {detail}", flush=True)


def run(
    cmd: Sequence[str],
    *,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command, its output kept; a failure names the command and its last lines."""
    done = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    if check and done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise SmokeFailure(f"{' '.join(cmd)} exited {done.returncode}:\n{tail}")
    return done


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise SmokeFailure(f"timed out after {timeout:.0f} s waiting for {what}")


class Compose:
    """The compose project, driven through podman-compose or docker compose."""

    def __init__(self, project: str, engine: str, compose: list[str], env: dict[str, str]):
        self.project, self.engine, self.compose, self.env = project, engine, compose, env

    def __call__(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [*self.compose, "-p", self.project, *args], timeout=timeout, env=self.env, check=check
        )

    def containers(self) -> dict[str, str]:
        """Service name -> container name, for the containers of this project."""
        names = run(
            [
                self.engine,
                "ps",
                "-a",
                "--format",
                "{{.Names}}",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
            ]
        ).stdout.split()
        found: dict[str, str] = {}
        for name in names:
            service = run(
                [
                    self.engine,
                    "inspect",
                    "--format",
                    '{{index .Config.Labels "com.docker.compose.service"}}',
                    name,
                ]
            )
            found[service.stdout.strip()] = name
        return found

    def healthy(self, container: str) -> bool:
        """Is the container healthy? Podman without systemd has no timer to run health
        checks, so here the check is run on demand, as that timer would run it."""
        if self.engine == "podman" and not Path("/run/systemd/system").exists():
            return (
                run(["podman", "healthcheck", "run", container], check=False, timeout=30).returncode
                == 0
            )
        status = run(
            [self.engine, "inspect", "--format", "{{.State.Health.Status}}", container], check=False
        )
        return status.stdout.strip() == "healthy"

    def wait_healthy(self, timeout: float) -> None:
        def all_healthy() -> bool:
            containers = self.containers()
            missing = set(SERVICES) - set(containers)
            if missing:
                return False
            return all(self.healthy(containers[s]) for s in SERVICES)

        wait_for(all_healthy, timeout, f"all of {', '.join(SERVICES)} to be healthy")

    def volumes(self) -> list[str]:
        return run(
            [
                self.engine,
                "volume",
                "ls",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
            ]
        ).stdout.split()


def build_images(engine: str, ca_file: str | None) -> None:
    secret = ["--secret", f"id=extra_ca,src={ca_file}"] if ca_file else []
    docker_format = ["--format", "docker"] if engine == "podman" else []
    for target, tag in (("service", "eos:latest"), ("spark", "eos-spark:latest")):
        run(
            [engine, "build", *docker_format, *secret, "--target", target, "-t", tag, "."],
            timeout=1800,
        )
    has_postgres = run([engine, "image", "inspect", "postgres:15"], check=False).returncode == 0
    if (
        not has_postgres
        and run([engine, "pull", "-q", "postgres:15"], check=False, timeout=300).returncode != 0
    ):
        print(
            "[smoke] postgres:15 cannot be pulled here: building the test stand-in "
            f"from Debian's postgresql-15 ({STANDIN.relative_to(ROOT)})",
            flush=True,
        )
        run(
            [engine, "build", *docker_format, "-t", "docker.io/library/postgres:15", str(STANDIN)],
            timeout=900,
        )


def ports_taken() -> list[int]:
    taken = []
    for port in HOST_PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def advertised_host() -> str:
    """An address of this host that containers reach as well: the one the default route
    leaves from (loopback would mean each container itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.254", 9))  # no packet is sent for a UDP connect
        return str(sock.getsockname()[0])


def sdk_transactions(bootstrap: str, topic: str, report: Report) -> None:
    from sdk import AdminClient, TransactionalProducer
    from spark_jobs.check import read_all

    with AdminClient(bootstrap) as admin:
        info = admin.create_topic(topic, 3)
    replicas = {len(p.replicas) for p in info.partitions}
    if replicas != {3}:
        raise SmokeFailure(f"{topic} was created with {replicas} replicas per partition, not 3")
    with TransactionalProducer(bootstrap, f"smoke-{uuid.uuid4().hex[:8]}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(300):
            producer.send(topic, f"committed-{i}", key=f"k{i % 7}")
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(100):
            producer.send(topic, f"aborted-{i}", key=f"k{i % 7}")
        producer.flush()
        producer.abort_transaction()
    values = sorted(str(r.value) for r in read_all(bootstrap, topic))
    if values != sorted(f"committed-{i}" for i in range(300)):
        raise SmokeFailure(
            f"read_committed of {topic} shows {len(values)} records, "
            f"{sum(v.startswith('aborted') for v in values)} of them aborted"
        )
    report.passed("sdk transaction", "300 committed visible, 100 aborted hidden, RF=3")


def topic_state(bootstrap: str, topics: list[str]) -> dict[str, list[int]]:
    """Each topic's high watermarks: what must survive a restart."""
    from sdk import AdminClient, TopicPartition

    state: dict[str, list[int]] = {}
    with AdminClient(bootstrap) as admin:
        for topic in topics:
            count = len(admin.describe_topic(topic).partitions)
            state[topic] = [
                admin.list_offsets(TopicPartition(topic, p)).high_watermark for p in range(count)
            ]
    return state


def spark_pipeline(
    compose: Compose, bootstrap: str, events: int, suffix: str, report: Report
) -> dict[str, str]:
    from sdk import AdminClient
    from spark_jobs.examples.events import make_events

    names = {
        "source": f"events-{suffix}",
        "enriched": f"enriched-{suffix}",
        "dead_letter": f"dead-letter-{suffix}",
        "app": f"smoke-{suffix}",
    }
    with AdminClient(bootstrap) as admin:
        admin.create_topic(names["source"], 4)
        admin.create_topic(names["enriched"], 4)
        admin.create_topic(names["dead_letter"], 1)
    make_events(bootstrap, names["source"], events)
    master = compose.containers()["spark-master"]
    started = time.monotonic()
    done = run(
        [
            compose.engine,
            "exec",
            master,
            "eos",
            "spark",
            "run",
            "--bootstrap",
            INTERNAL_BOOTSTRAP,
            "--app",
            names["app"],
            "--source",
            names["source"],
            "--transform",
            "spark_jobs.examples.events:record_transform",
            "-o",
            f"enriched={names['enriched']}",
            "-o",
            f"dead_letter={names['dead_letter']}",
            "--master",
            "spark://spark-master:7077",
            "--conf",
            "spark.driver.host=spark-master",
            "--conf",
            "spark.executor.memory=1g",
        ],
        timeout=900,
    )
    seconds = report.timed("spark pipeline", started)
    summary = done.stdout.strip().splitlines()[-1]
    report.figures["pipeline records/s (incl. job start)"] = round(events / seconds)
    inner = summary.split(",")[-1].strip().removesuffix("s")
    report.figures["pipeline records/s (batches only)"] = round(events / float(inner))
    check_pipeline(bootstrap, names, report, "spark exactly-once")
    with urllib.request.urlopen("http://127.0.0.1:8088/json/", timeout=10) as answer:
        apps = json.load(answer)
    ran = [a for a in apps.get("completedapps", []) if a["name"] == f"eos-{names['app']}"]
    workers = {w["host"] for w in apps.get("workers", [])}
    if not ran or workers != {"spark-worker"}:
        raise SmokeFailure(f"the master did not run eos-{names['app']} on spark-worker: {apps}")
    report.passed("spark executors", f"app {ran[0]['id']} on the master, workers {workers}")
    return names


def settled(
    now: Callable[[], dict[str, list[int]]], expected: dict[str, list[int]], what: str
) -> None:
    """Until the offsets are the expected ones again; a failure shows both."""
    last: list[dict[str, list[int]]] = []

    def same() -> bool:
        try:
            last[:] = [now()]
        except Exception:  # a leader still being elected
            return False
        return last[0] == expected

    try:
        wait_for(same, 60, f"the offsets to be as before ({what})")
    except SmokeFailure as exc:
        raise SmokeFailure(f"{exc}: {expected} -> {last[0] if last else '?'}") from None


def check_pipeline(bootstrap: str, names: dict[str, str], report: Report, label: str) -> None:
    from spark_jobs.check import check_topics, offsets_at_end, read_all
    from spark_jobs.examples.events import output_source, source_of

    expected = [source_of(r) for r in read_all(bootstrap, names["source"])]
    result = check_topics(
        bootstrap, [names["enriched"], names["dead_letter"]], expected, output_source
    )
    offsets = offsets_at_end(bootstrap, names["source"], names["app"])
    if not result.ok or any(c != end for c, end in offsets.values()):
        raise SmokeFailure(f"{label}: {result}; offsets {offsets}")
    report.passed(label, str(result))


def smoke(args: argparse.Namespace) -> Report:
    report = Report()
    engine = "podman" if shutil.which("podman") else "docker"
    beside = Path(sys.executable).parent / "podman-compose"
    podman_compose = str(beside) if beside.exists() else shutil.which("podman-compose")
    if engine == "podman" and podman_compose is None:
        raise SmokeFailure("podman is here but podman-compose is not (pip install podman-compose)")
    compose_cmd = [str(podman_compose)] if engine == "podman" else ["docker", "compose"]
    # What a run of the same project that was cut off left behind (its containers hold
    # the ports) goes first.
    Compose(args.project, engine, compose_cmd, {**os.environ, "EOS_INTERNAL_TOKEN": "x" * 32})(
        "down", "-v", check=False
    )
    taken = ports_taken()
    if taken:
        raise SmokeFailure(f"host ports {taken} are taken; the compose file publishes them")
    host = args.advertised_host or advertised_host()
    env = {**os.environ, "EOS_INTERNAL_TOKEN": secrets.token_hex(24), "EOS_ADVERTISED_HOST": host}
    compose = Compose(args.project, engine, compose_cmd, env)
    bootstrap = f"http://{host}:8080,http://{host}:8081"

    started = time.monotonic()
    build_images(engine, args.ca_file)
    report.timed("build", started)
    try:
        started = time.monotonic()
        compose("up", "-d")
        compose.wait_healthy(args.timeout)
        report.timed("up to healthy", started)
        report.passed("healthy", ", ".join(SERVICES))

        suffix = uuid.uuid4().hex[:6]
        sdk_transactions(bootstrap, f"orders-{suffix}", report)
        names = spark_pipeline(compose, bootstrap, args.events, suffix, report)
        topics = [names["source"], names["enriched"], names["dead_letter"], f"orders-{suffix}"]
        before = topic_state(bootstrap, topics)

        node = compose.containers()["node-1"]
        started = time.monotonic()
        run([engine, "kill", "--signal", "KILL", node])
        run([engine, "start", node], check=False)  # a restart policy may have won the race
        compose.wait_healthy(args.timeout)
        report.timed("node SIGKILL to healthy", started)
        # A new leader's high watermark catches up with its followers' first fetches.
        settled(lambda: topic_state(bootstrap, topics), before, "node-1 came back")
        check_pipeline(bootstrap, names, report, "after node SIGKILL")

        started = time.monotonic()
        compose("down")
        compose("up", "-d")
        compose.wait_healthy(args.timeout)
        report.timed("down, up to healthy", started)
        settled(lambda: topic_state(bootstrap, topics), before, "after down and up")
        check_pipeline(bootstrap, names, report, "after down and up")
    finally:
        compose("down", "-v")
    left = compose.volumes()
    if left or compose.containers():
        raise SmokeFailure(f"down -v left volumes {left} or containers behind")
    report.passed("down -v", "no container or volume of the project left")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--project", default="eossmoke", help="Compose project name.")
    parser.add_argument("--events", type=int, default=100_000, help="Pipeline input size.")
    parser.add_argument("--timeout", type=float, default=180, help="Seconds to healthy.")
    parser.add_argument("--advertised-host", help="Default: this host's outward address.")
    parser.add_argument(
        "--ca-file",
        default=os.environ.get("EOS_BUILD_CA_FILE") or None,
        help="Extra CA for the image build (a TLS-inspecting proxy).",
    )
    parser.add_argument("--report", type=Path, help="Write the figures here as JSON.")
    args = parser.parse_args()
    try:
        report = smoke(args)
    except (SmokeFailure, subprocess.TimeoutExpired) as exc:
        print(f"[smoke] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    if args.report:
        args.report.write_text(
            json.dumps({"figures": report.figures, "checks": report.checks}, indent=2)
        )
    print(json.dumps(report.figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
