"""docker-compose.yml built and run for real (scripts/compose-smoke.sh), as a user runs it.

The script builds both images (with podman here, prepared by scripts/podman-setup.sh),
brings the eight services up and waits until each is healthy, then from the host through
the published ports commits and aborts a transaction with the SDK and runs the
exactly-once Spark pipeline on the compose Spark master (executors in the worker's
container), SIGKILLs a node's container and starts it again, downs and ups the project,
and removes it with its volumes. This test runs the script as the README's test command
does on a fresh machine and asserts what its report says: it fails, never skips, when
podman or the base image cannot be set up (the script exits non-zero, saying why).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 20_000
EXPECTED_CHECKS = {
    "healthy",
    "sdk transaction",
    "spark exactly-once",
    "spark executors",
    "after node SIGKILL",
    "after down and up",
    "down -v",
}


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(2400)
def test_the_compose_project_builds_runs_survives_a_node_kill_and_cleans_up(
    tmp_path: Path,
) -> None:
    report_path = tmp_path / "report.json"
    began = time.monotonic()
    done = subprocess.run(
        ["bash", "scripts/compose-smoke.sh", "--events", str(EVENTS), "--report",
         str(report_path), "--project", "eostest"],
        cwd=ROOT, capture_output=True, text=True, timeout=2300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    print(output[-4000:])
    print(f"compose run: {time.monotonic() - began:.0f} s")
    assert done.returncode == 0, f"compose-smoke.sh exited {done.returncode}:\n{output[-6000:]}"
    report = json.loads(report_path.read_text())
    assert set(report["checks"]) == EXPECTED_CHECKS, report["checks"]
    figures = report["figures"]
    for name in ("build", "up to healthy", "spark pipeline", "node SIGKILL to healthy"):
        assert figures[name] > 0, figures
    assert figures["pipeline records/s (batches only)"] > 0, figures
    assert report["checks"]["spark exactly-once"].startswith(
        f"exactly once: {EVENTS} expected, {EVENTS} delivered"
    ), report["checks"]
