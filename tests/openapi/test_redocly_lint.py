"""Both committed OpenAPI documents pass Redocly's recommended lint with no error and no
warning: a linter written elsewhere, which reads the documents as a client's tooling
would (servers to call, examples that hold to their schemas, a 4XX answer per operation).

``redocly/package.json`` pins the CLI and ``redocly/redocly.yaml`` holds the ruleset (with
its one commented exception). The npm package is installed once into a cache directory
keyed by that manifest's content (``EOS_REDOCLY_CACHE`` overrides its place), as the
TypeScript client test does. Without Node.js or npm, or when the registry is unreachable,
this test fails: it never skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.openapi.conftest import DOCS

REDOCLY = Path(__file__).resolve().parent / "redocly"
DOCUMENTS = ("coordinator.json", "node.json")
#: No telemetry and no update check: the lint needs nothing but the registry's install.
QUIET = {"REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true"}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is required for the Redocly lint of the OpenAPI documents",
                    pytrace=False)  # fmt: skip
    return found


def _toolchain() -> Path:
    """``node_modules/.bin/redocly`` of ``redocly/package.json``, installed once, reused.

    The install is made in a directory of its own and renamed into place when complete,
    so two test runs at once never share a half-installed ``node_modules``."""
    manifest = (REDOCLY / "package.json").read_bytes()
    key = hashlib.sha256(manifest).hexdigest()[:16]
    base = Path(os.environ.get("EOS_REDOCLY_CACHE", Path.home() / ".cache" / "eos-redocly"))
    home = base / key
    cli = Path("node_modules", ".bin", "redocly")
    if (home / cli).exists():
        return home / cli
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=base))
    (staging / "package.json").write_bytes(manifest)
    done = subprocess.run(
        [_tool("npm"), "install", "--no-audit", "--no-fund", "--no-save"],
        cwd=staging, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0 or not (staging / cli).exists():
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"npm install of @redocly/cli failed ({done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}", pytrace=False)  # fmt: skip
    if home.exists() and not (home / cli).exists():
        shutil.rmtree(home, ignore_errors=True)  # an incomplete install of an older layout
    try:
        staging.rename(home)
    except OSError:  # another run put its own install there first: use that one
        shutil.rmtree(staging, ignore_errors=True)
    return home / cli


def _problems(report: dict[str, Any]) -> list[str]:
    return [
        f"{p['severity']} {p['ruleId']} at "
        f"{', '.join(loc.get('pointer', '?') for loc in p.get('location', []))}: {p['message']}"
        for p in report.get("problems", [])
    ]


@pytest.fixture(scope="module")
def redocly() -> Path:
    _tool("node")
    return _toolchain()


@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_passes_redocly_recommended(redocly: Path, document: str) -> None:
    done = subprocess.run(
        [str(redocly), "lint", "--config", str(REDOCLY / "redocly.yaml"), "--format", "json",
         "--max-problems", "1000", str(DOCS / document)],
        cwd=REDOCLY, capture_output=True, text=True, timeout=180,
        env={**os.environ, **QUIET},
    )  # fmt: skip
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"redocly lint gave no report ({done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}", pytrace=False)  # fmt: skip
    problems = _problems(report)
    totals = report.get("totals", {})
    assert not problems and not totals.get("errors") and not totals.get("warnings"), (
        f"docs/openapi/{document}: {totals}\n" + "\n".join(problems)
    )
    assert done.returncode == 0, done.stderr
