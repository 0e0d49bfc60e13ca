"""The distribution's shape: a lean SDK, a pure contract, services that load no client code,
and benchmarks that run from an installed package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg")
SERVER_DISTRIBUTIONS = (
    "fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "pydantic-settings"
)


def loaded_after(statement: str) -> set[str]:
    """Top-level module names a fresh interpreter has loaded after ``statement``."""
    script = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return {name.split(".")[0] for name in json.loads(done.stdout)}


@pytest.mark.unit
def test_every_package_of_the_tree_is_distributed() -> None:
    declared = set(PYPROJECT["tool"]["setuptools"]["packages"])
    prefixes = ("sdk", "eos_protocol", "eos_server", "eos_security", "coordinator_service",
                "partition_service", "spark_jobs", "eos_cli", "migrations")
    found = {
        name for name in find_packages(str(ROOT))
        if name.split(".")[0] in prefixes
    }
    found |= {"migrations.versions"}  # the Alembic scripts: a directory without __init__
    found |= {name.replace("bench", "eos_bench", 1)
              for name in find_packages(str(ROOT)) if name.split(".")[0] == "bench"}
    assert declared == found


@pytest.mark.unit
def test_the_base_install_is_the_sdk_alone() -> None:
    base = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    assert not [name for name in SERVER_DISTRIBUTIONS if name in base]
    server = " ".join(PYPROJECT["project"]["optional-dependencies"]["server"]).lower()
    assert all(name in server for name in SERVER_DISTRIBUTIONS)
    for requirement in PYPROJECT["project"]["dependencies"]:
        assert "<" in requirement, f"{requirement}: no upper bound"


def test_importing_the_sdk_loads_no_server_code() -> None:
    loaded = loaded_after("import sdk")
    assert not loaded & {*SERVER_MODULES, "eos_server", "coordinator_service",
                         "partition_service", "eos_security"}


def test_the_contract_imports_only_pydantic() -> None:
    loaded = loaded_after("import eos_protocol.acl, eos_protocol.coordinator, eos_protocol.node,"
                          " eos_protocol.partitioning, eos_protocol.paths, eos_protocol.addresses")
    assert not loaded & {*SERVER_MODULES, "sdk", "httpx", "eos_server"}


def test_services_load_no_client_code() -> None:
    loaded = loaded_after("import coordinator_service.app, partition_service.app")
    assert "sdk" not in loaded


@pytest.mark.slow
def test_eos_bench_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    """Built and installed outside the source tree, the benchmarks still import and run
    their own modules (no sys.path edits, no tests.* imports)."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True,
    )
    [wheel] = wheels.glob("eos-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    script = (
        "import eos_bench, eos_bench.suite, eos_bench.harness, eos_bench.bench_coordinator\n"
        "import eos_bench.suite_coord, eos_bench.suite_node, eos_bench.suite_clients\n"
        "print(eos_bench.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(target))
    helped = subprocess.run(
        [sys.executable, "-c", "from eos_cli.main import app; app()", "bench", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    assert helped.returncode == 0, helped.stderr
    assert "--only" in helped.stdout


@pytest.mark.unit
def test_the_eos_command_without_the_server_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from eos_cli import entry

    monkeypatch.delitem(sys.modules, "eos_cli.main", raising=False)
    monkeypatch.setitem(sys.modules, "typer", None)  # what an SDK-only install looks like
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 2
    assert "pip install 'eos[server]'" in capsys.readouterr().err
