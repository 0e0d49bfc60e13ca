"""``eos auth new-token`` and ``eos acls`` against a cluster with authentication on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eos_cli.main import app
from eos_security.tokens import TokenRegistry
from tests.support.cluster import ClusterFactory

runner = CliRunner()


@pytest.fixture(autouse=True)
def _credentials_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """``eos --token`` exports EOS_TOKEN for the process; undo that after each test."""
    monkeypatch.delenv("EOS_TOKEN", raising=False)
    monkeypatch.delenv("EOS_CA_FILE", raising=False)


@pytest.mark.unit
def test_new_token_prints_the_token_and_stores_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    tokens = []
    for name in ("a", "b"):
        result = runner.invoke(
            app, ["auth", "new-token", "--principal", f"User:{name}", "--tokens-file", str(path)]
        )
        assert result.exit_code == 0, result.output
        tokens.append(result.stdout.strip().splitlines()[-1])
    text = path.read_text()
    assert all(token not in text for token in tokens)
    registry = TokenRegistry(path)
    assert [registry.principal(t) for t in tokens] == ["User:a", "User:b"]
    bad = runner.invoke(app, ["auth", "new-token", "--principal", "alice"])
    assert bad.exit_code != 0


@pytest.mark.slow
def test_acls_commands_and_the_token_option(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(database="postgres", auth=True)
    admin = ["--token", cluster.tokens["admin"]]
    boot = ["-b", cluster.url]
    added = runner.invoke(app, [*admin, "acls", "add", "--principal", "User:etl",
                                "-o", "read", "-o", "write", "-t", "topic", "-n", "orders",
                                *boot])
    assert added.exit_code == 0, added.output
    listed = runner.invoke(app, [*admin, "acls", "list", "--principal", "User:etl", *boot])
    assert listed.exit_code == 0 and listed.stdout.count("orders") == 2, listed.output
    refused = runner.invoke(app, ["--token", cluster.tokens["etl"], "acls", "list", *boot])
    assert refused.exit_code == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.output
    anonymous = runner.invoke(app, ["--token", "eos_nobody", "topics", "list", *boot])
    assert anonymous.exit_code == 1 and "UNAUTHENTICATED" in anonymous.output
    removed = runner.invoke(app, [*admin, "acls", "remove", "--principal", "User:etl",
                                  *boot])
    assert removed.exit_code == 0 and "2 binding(s) removed" in removed.output
    empty = runner.invoke(app, [*admin, "acls", "list", *boot])
    assert "orders" not in empty.stdout


@pytest.mark.parametrize("module", ["partition_service", "coordinator_service"])
def test_a_bad_tokens_file_stops_the_service_with_a_clear_error(
    module: str, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\nprincipal = "User:a"\ntoken = "plain-text"\n')
    done = subprocess.run(
        [sys.executable, "-m", module, "--auth-tokens-file", str(tokens), "--data-dir",
         str(tmp_path / "data"), "--port", "0", "--log-format", "text"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "cannot start" in done.stderr and "never the token itself" in done.stderr
    assert "plain-text" not in done.stderr
