"""A TypeScript client generated from the committed documents with @hey-api/openapi-ts runs
the whole transactional lifecycle (``ts/lifecycle.ts``) and a consumer group's membership,
reads and offset commits (``ts/group.ts``) against a live cluster on the machine's Node.js.

The npm packages of ``ts/package.json`` are installed once into a cache directory keyed by
that file's content (``EOS_TS_CACHE`` overrides its place). Without Node.js or npm, or when
the registry is unreachable, this test fails: it never skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.openapi.conftest import DOCS
from tests.support.cluster import Cluster

TS = Path(__file__).resolve().parent / "ts"
#: The driver programs, type-checked together with the generated clients (tsconfig.json).
PROGRAMS = ("lifecycle.ts", "group.ts")


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as late:
        pytest.fail(
            f"{' '.join(args)} timed out after {timeout} s:\n{_text(late.stdout)}\n"
            f"{_text(late.stderr)}",
            pytrace=False,
        )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    return done


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _outcome(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The program's last line of output, read as its JSON outcome; the whole output shown
    when it is not one."""
    lines = done.stdout.strip().splitlines()
    try:
        outcome = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        outcome = None
    if not isinstance(outcome, dict):
        pytest.fail(f"no JSON outcome:\n{done.stdout}\n{done.stderr}", pytrace=False)
    return outcome


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is required for the TypeScript client test", pytrace=False)
    return found


def _toolchain() -> Path:
    """A directory with node_modules/ for ts/package.json, installed once and reused."""
    manifest = (TS / "package.json").read_bytes()
    key = hashlib.sha256(manifest).hexdigest()[:16]
    base = Path(os.environ.get("EOS_TS_CACHE", Path.home() / ".cache" / "eos-openapi-ts"))
    home = base / key
    if (home / "node_modules" / ".bin" / "openapi-ts").exists():
        return home
    home.mkdir(parents=True, exist_ok=True)
    (home / "package.json").write_bytes(manifest)
    _run([_tool("npm"), "install", "--no-audit", "--no-fund", "--no-save"], home, timeout=300)
    return home


@pytest.fixture(scope="module")
def ts_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _tool("node")
    toolchain = _toolchain()
    project = tmp_path_factory.mktemp("generated-ts")
    (project / "node_modules").symlink_to(toolchain / "node_modules", target_is_directory=True)
    for name in ("package.json", "tsconfig.json", *PROGRAMS):
        shutil.copy(TS / name, project / name)
    bin_dir = project / "node_modules" / ".bin"
    for service in ("coordinator", "node"):
        _run(
            [str(bin_dir / "openapi-ts"), "-i", str(DOCS / f"{service}.json"),
             "-o", str(project / service), "-c", "@hey-api/client-fetch"],
            project, timeout=120,
        )
    # The generated clients and every driver type-check together (strict), once.
    _run([str(bin_dir / "tsc"), "-p", "tsconfig.json"], project, timeout=120)
    return project


def test_generated_typescript_client_runs_the_lifecycle(
    ts_project: Path, openapi_cluster: Cluster
) -> None:
    bin_dir = ts_project / "node_modules" / ".bin"
    done = _run([str(bin_dir / "tsx"), "lifecycle.ts", openapi_cluster.url], ts_project, 120)
    outcome = _outcome(done)
    output = f"{done.stdout}\n{done.stderr}"
    assert outcome["ok"] is True, output
    assert outcome["committed"] == ["committed-1", "committed-2"], output
    assert outcome["fenced"] == "PRODUCER_FENCED", output


def test_generated_typescript_client_runs_a_consumer_group(
    ts_project: Path, openapi_cluster: Cluster
) -> None:
    """Join, read every record, commit, a second member takes half the partitions only
    after the first let go of them (never both holding one), stable, leave, fenced."""
    bin_dir = ts_project / "node_modules" / ".bin"
    done = _run([str(bin_dir / "tsx"), "group.ts", openapi_cluster.url], ts_project, 180)
    outcome = _outcome(done)
    output = f"{done.stdout}\n{done.stderr}"
    assert outcome["ok"] is True, output
    assert sorted(len(a) for a in outcome["assignments"]) == [2, 2], output
    assert sorted(p for a in outcome["assignments"] for p in a) == [0, 1, 2, 3], output
    assert outcome["committed"] == {str(p): 4 for p in range(4)}, output
    assert outcome["described"] == {"state": "stable", "members": 2}, output
    assert outcome["unknown_member"] == "UNKNOWN_MEMBER_ID", output
