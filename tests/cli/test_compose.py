"""docker-compose.yml and the Dockerfile, checked without a container engine: the
services, their start order, health checks, volumes, ports, that every EOS_ variable they
set is one the code really reads, that the internal token has no default, that every node
and Spark container is given every coordinator, and that the advertised addresses follow
EOS_ADVERTISED_HOST. tests/deploy/test_compose_run.py builds and runs the same files.

Compose's variable interpolation is done here as compose does it (``${VAR}``,
``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}``, ``$$``),
so that these checks run wherever the tests do, whether or not a compose CLI is
installed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from coordinator_service.settings import CoordinatorSettings
from partition_service.settings import NodeSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
COORDINATORS = ["coordinator-1", "coordinator-2"]
NODES = ["node-1", "node-2", "node-3"]
SPARK = ["spark-master", "spark-worker"]
COORDINATOR_PORTS = {"coordinator-1": 8080, "coordinator-2": 8081}
NODE_PORTS = {"node-1": 9091, "node-2": 9092, "node-3": 9093}
EVERY_COORDINATOR = [f"http://{name}:{port}" for name, port in COORDINATOR_PORTS.items()]
TOKEN = "0123456789abcdef" * 3  # what `openssl rand -hex 24` makes: 48 characters
SHELL = {"EOS_INTERNAL_TOKEN": TOKEN}  # the least a shell must export


class RequiredVariable(Exception):
    """Compose's refusal for ``${VAR:?message}`` with VAR unset (or empty)."""


def interpolate(value: str, shell: Mapping[str, str]) -> str:
    """``value`` with its variables replaced as compose replaces them."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        given = shell.get(name)
        if op in (":?", "?") and (given is None or (op == ":?" and not given)):
            raise RequiredVariable(f"required variable {name} is missing a value: {arg}")
        if (op == ":-" and not given) or (op == "-" and given is None):
            return str(arg)
        return given or ""

    result = INTERPOLATION.sub(one, value)
    unparsed = INTERPOLATION.sub("", value)
    assert "$" not in unparsed, f"{value!r}: compose would call this an invalid template"
    return result


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def env_of(service: dict[str, Any], shell: Mapping[str, str] = SHELL) -> dict[str, str]:
    """The service's environment as compose would set it from the shell's variables
    (by default, just the internal token that compose requires)."""
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment must be a mapping"
    return {str(k): interpolate(str(v), shell) for k, v in env.items()}


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", *COORDINATORS, *NODES, "spark-master", "spark-worker"}
    assert services["postgres"]["image"].startswith("postgres:")
    for name in [*COORDINATORS, *NODES]:
        assert services[name]["image"] == "eos:latest"
        assert services[name]["build"] == {"context": ".", "target": "service"}
    for name in SPARK:
        assert services[name]["image"] == "eos-spark:latest"
        assert services[name]["build"] == {"context": ".", "target": "spark"}
    for name in COORDINATORS:
        assert services[name]["command"] == ["eos", "coordinator"]
    for name in NODES:
        assert services[name]["command"] == ["eos", "node"]
    assert "org.apache.spark.deploy.master.Master" in services["spark-master"]["command"]
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert service["hostname"] == name, name


def test_environment_variables_are_read_by_the_code(compose: dict[str, Any]) -> None:
    services = compose["services"]
    readers: dict[str, type[BaseSettings]] = {
        **{n: CoordinatorSettings for n in COORDINATORS},
        **{n: NodeSettings for n in NODES},
    }
    for name, settings in readers.items():
        env = env_of(services[name])
        assert env, name
        for key in env:
            assert key.startswith("EOS_"), f"{name}: {key}"
            field = key.removeprefix("EOS_").lower()
            assert field in settings.model_fields, f"{name} sets {key}, which nothing reads"


def test_settings_built_from_the_compose_environment(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    for key, value in env_of(services["coordinator-1"]).items():
        monkeypatch.setenv(key, value)
    coordinator = CoordinatorSettings()
    assert coordinator.database_url and coordinator.database_url.startswith("postgresql+psycopg")
    assert coordinator.node_urls == {n: f"http://node-{n}:909{n}" for n in (1, 2, 3)}
    assert coordinator.default_replication_factor == 3, "every partition on every node"
    assert coordinator.internal_token
    for key in env_of(services["coordinator-1"]):
        monkeypatch.delenv(key)
    for key, value in env_of(services["node-2"]).items():
        monkeypatch.setenv(key, value)
    node = NodeSettings()
    assert (node.node_id, node.port, str(node.data_dir)) == (2, 9092, "/data")
    assert re.findall(r"http://[\w.-]+:\d+", str(node.coordinator_url)) == EVERY_COORDINATOR
    assert node.internal_token == TOKEN


def test_nodes_list_matches_node_services(compose: dict[str, Any]) -> None:
    nodes = env_of(compose["services"]["coordinator-1"])["EOS_NODES"]
    hosts = {entry.split("=", 1)[1].split("//")[1].split(":")[0] for entry in nodes.split(",")}
    assert hosts == set(NODES)


def test_health_checks_start_order_ports_and_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in services:
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and len(test) > 1, name
    for name in [*COORDINATORS, *NODES]:
        assert services[name]["healthcheck"]["test"] == ["CMD", "eos-healthcheck"], name
    for name, web_port in {"spark-master": 8088, "spark-worker": 8089}.items():
        check = services[name]["healthcheck"]["test"]
        assert check[-1] == f"http://127.0.0.1:{web_port}/json/", name
        assert str(web_port) in services[name]["command"], name
    for name in COORDINATORS:
        assert services[name]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in NODES:  # a node runs and serves data while the database is away
        assert "depends_on" not in services[name], name
    published = [p for s in services.values() for p in s.get("ports", [])]
    host_ports = [p.split(":")[0] for p in published]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same port"
    listening = {**COORDINATOR_PORTS, **NODE_PORTS}
    for name, port in listening.items():
        # Published on the port it listens on: one URL inside the network and outside.
        assert services[name]["ports"] == [f"{port}:{port}"], name
        assert env_of(services[name])["EOS_PORT"] == str(port), name
    volumes = set(compose["volumes"])
    for name in NODES:
        volume, path = services[name]["volumes"][0].split(":")
        assert volume in volumes and path == env_of(services[name])["EOS_DATA_DIR"]
    node_volumes = [services[n]["volumes"][0].split(":")[0] for n in NODES]
    assert len(set(node_volumes)) == len(NODES), "each node needs its own volume"
    assert services["postgres"]["volumes"][0].split(":")[0] in volumes


def test_advertised_addresses_follow_eos_advertised_host(compose: dict[str, Any]) -> None:
    """The coordinators hand out the nodes' and their own URLs: the service names by
    default (clients inside the network), the host's name when one is given."""
    services = compose["services"]
    for shell, host_of in (
        (SHELL, lambda name: name),
        ({**SHELL, "EOS_ADVERTISED_HOST": "eos.example.net"}, lambda name: "eos.example.net"),
    ):
        for name in COORDINATORS:
            env = env_of(services[name], shell)
            nodes = dict(entry.split("=", 1) for entry in env["EOS_NODES"].split(","))
            assert nodes == {
                node.removeprefix("node-"): f"http://{host_of(node)}:{port}"
                for node, port in NODE_PORTS.items()
            }
            assert env["EOS_PUBLIC_URL"] == f"http://{host_of(name)}:{COORDINATOR_PORTS[name]}"


def test_the_dockerfile_is_pinned_multi_stage_and_runs_as_a_user() -> None:
    """What issue-free builds need: a Debian release that still ships Java 17, images that
    hold no compilers, pip or pip cache, a user that is not root, a working health check,
    and every package of the project."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.MULTILINE)
    names = [name for _, name in stages]
    assert {"runtime", "deps", "build", "service", "spark"} <= set(names), names
    assert re.search(r"^ARG DEBIAN_RELEASE=bookworm$", text, re.MULTILINE)
    assert ("docker.io/library/debian:${DEBIAN_RELEASE}-slim", "runtime") in stages
    final = {name: text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]
             for name in ("service", "spark")}  # fmt: skip
    for name, body in final.items():
        assert "USER eos" in body, name
        assert "HEALTHCHECK" in body and "eos-healthcheck" in body, name
        for tool in ("gcc", "build-essential", "python3-venv", "pip install"):
            assert tool not in body, f"{name} installs {tool}"
    # both from the runtime: the Spark image's Java layer stays cached while the code changes
    assert ("runtime", "service") in stages and ("runtime", "spark") in stages
    # the dependencies are installed from lists read out of pyproject.toml in a stage of
    # their own, so a new version number or test setting does not install them again
    deps = text.split(" AS deps\n", 1)[1].split("\nFROM ", 1)[0]
    assert "COPY pyproject.toml" not in deps and "COPY --from=requirements" in deps
    assert "openjdk-17-jre-headless" in final["spark"]
    assert "pip uninstall -y -q pip setuptools wheel" in text
    instructions = re.split(r"\n(?=[A-Z]+ )", text.replace("\\\n", " "))
    installs = [i for i in instructions if i.startswith("RUN") and "pip install" in i]
    assert installs
    for run in installs:  # the cache is a build mount, or there is none: no layer holds it
        assert "--no-cache-dir" in run or "--mount=type=cache,target=/root/.cache/pip" in run, run
    for package in [
        "sdk", "eos_protocol", "eos_server", "eos_security", "eos_cli",
        "coordinator_service", "partition_service", "spark_jobs", "migrations",
    ]:  # fmt: skip
        assert f"COPY {package} /src/{package}" in text, package
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests", "secrets"} <= set(ignored)


def test_auth_is_off_by_default_and_on_with_a_tokens_file(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The compose file's documented switch: EOS_AUTH_TOKENS_FILE (and EOS_SUPER_USERS)."""
    services = compose["services"]
    for key, value in env_of(services["coordinator-1"]).items():
        monkeypatch.setenv(key, value)
    off = CoordinatorSettings()
    assert off.auth_tokens_file is None and off.token_registry() is None
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("")
    shell = {**SHELL, "EOS_AUTH_TOKENS_FILE": str(tokens), "EOS_SUPER_USERS": "User:admin"}
    for name in [*COORDINATORS, *NODES]:
        assert "/secrets" in " ".join(services[name]["volumes"]), name
        for key, value in env_of(services[name], shell).items():
            monkeypatch.setenv(key, value)
        settings = (CoordinatorSettings if name in COORDINATORS else NodeSettings)()
        assert settings.auth_tokens_file == tokens and settings.token_registry() is not None
    assert CoordinatorSettings().super_user_list == ["User:admin"]


def test_the_internal_token_has_no_default(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node ports are published, and the internal token lets whoever has it post commit
    and abort markers: compose must refuse to start without one, saying what to do."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    raw = compose["x-internal-token"]["EOS_INTERNAL_TOKEN"]
    required = re.fullmatch(r"\$\{EOS_INTERNAL_TOKEN:\?([^}$]+)\}", raw)
    assert required, f"not compose's required-variable form: {raw!r}"
    message = required.group(1)
    assert "32 characters" in message and "openssl rand -hex 24" in message
    services = compose["services"]
    for name in [*COORDINATORS, *NODES]:
        assert services[name]["environment"]["EOS_INTERNAL_TOKEN"] == raw, name
        for shell in ({}, {"EOS_INTERNAL_TOKEN": ""}):
            with pytest.raises(RequiredVariable, match="openssl rand -hex 24"):
                env_of(services[name], shell)
    for name in [*SPARK, "postgres"]:
        assert "EOS_INTERNAL_TOKEN" not in services[name].get("environment", {}), name

    short = "change-me-internal-token"  # the old default: now refused by the services
    for key, value in env_of(services["coordinator-1"], {"EOS_INTERNAL_TOKEN": short}).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError, match="32"):
        CoordinatorSettings()
    monkeypatch.setenv("EOS_INTERNAL_TOKEN", TOKEN)
    assert CoordinatorSettings().internal_token == TOKEN


def test_nodes_and_spark_are_given_every_coordinator(compose: dict[str, Any]) -> None:
    """A node asks a coordinator to verify transactional batches: given only one, it
    refuses every transactional produce while that one is down."""
    services = compose["services"]
    public = [env_of(services[name])["EOS_PUBLIC_URL"] for name in COORDINATORS]
    assert public == EVERY_COORDINATOR
    for name, port in COORDINATOR_PORTS.items():
        assert env_of(services[name])["EOS_PORT"] == str(port)
    for name in NODES:
        assert env_of(services[name])["EOS_COORDINATOR_URL"].split(",") == EVERY_COORDINATOR
    for name in SPARK:
        assert env_of(services[name])["EOS_BOOTSTRAP"].split(",") == EVERY_COORDINATOR
    waits_for = set(services["spark-worker"]["depends_on"])
    assert set(COORDINATORS) <= waits_for

    # Nowhere else does the file name one coordinator by URL: only a coordinator's own
    # public URL may be a single one.
    for name, service in services.items():
        for key, value in env_of(service).items():
            if "coordinator-" in value and key != "EOS_PUBLIC_URL":
                assert value.split(",") == EVERY_COORDINATOR, f"{name}: {key}={value}"
        command = " ".join(map(str, service.get("command", [])))
        assert "coordinator-" not in command, f"{name} names a coordinator in its command"
