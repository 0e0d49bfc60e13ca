"""A TypeScript client generated from the committed documents with @hey-api/openapi-ts runs
the whole transactional lifecycle (``ts/lifecycle.ts``) against a live cluster on the
machine's Node.js.

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

import pytest

from tests.openapi.conftest import DOCS
from tests.support.cluster import Cluster

TS = Path(__file__).resolve().parent / "ts"


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    return done


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
    for name in ("package.json", "tsconfig.json", "lifecycle.ts"):
        shutil.copy(TS / name, project / name)
    bin_dir = project / "node_modules" / ".bin"
    for service in ("coordinator", "node"):
        _run(
            [str(bin_dir / "openapi-ts"), "-i", str(DOCS / f"{service}.json"),
             "-o", str(project / service), "-c", "@hey-api/client-fetch"],
            project, timeout=120,
        )
    return project


def test_generated_typescript_client_runs_the_lifecycle(
    ts_project: Path, openapi_cluster: Cluster
) -> None:
    bin_dir = ts_project / "node_modules" / ".bin"
    # The generated client and the driver type-check together (strict).
    _run([str(bin_dir / "tsc"), "-p", "tsconfig.json"], ts_project, timeout=120)
    done = _run([str(bin_dir / "tsx"), "lifecycle.ts", openapi_cluster.url], ts_project, 120)
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["ok"] is True
    assert outcome["committed"] == ["committed-1", "committed-2"]
    assert outcome["fenced"] == "PRODUCER_FENCED"
