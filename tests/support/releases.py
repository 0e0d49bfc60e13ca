"""Earlier releases of EOS, taken from this repository's history and installed in virtual
environments of their own, for the upgrade tests (``tests/upgrade/``).

A release is a named commit (``RELEASES``; ``CHANGELOG.md`` lists the same). Its tree is
exported with ``git archive`` into a folder and installed into a new virtual environment
with ``pip install --no-deps --no-build-isolation`` — a real install of the old package,
with its own ``eos`` modules, migrations and console entry points. Its third-party
dependencies are those of the current environment, reached through a ``.pth`` line: the
releases compared here ask for the same ranges, and the tests then need no network and
install in seconds. The current release's own editable install is not visible there (a
``.pth`` line adds a folder to the path but does not run the ``.pth`` files inside it).

Built environments are cached under ``EOS_RELEASES_CACHE`` (default: ``eos-releases``
inside the current virtual environment, whose packages they borrow) by commit, so the
tests of one run build each once and a new environment starts with none.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    #: what the release's own modules can do, for the tests that drive it
    replication: bool


#: Oldest first. The current tree is the release after the last one.
RELEASES = (
    Release("0.1.0", "956be73db354cffc74503e5e286ecdef9ba71cc0", replication=False),
    Release("0.2.0", "28b70d3", replication=True),
)


@dataclass(frozen=True)
class InstalledRelease:
    release: Release
    root: Path

    @property
    def python(self) -> str:
        return str(self.root / "venv" / "bin" / "python")

    def command(self, *args: str) -> list[str]:
        """The release's ``eos`` command line."""
        return [self.python, "-m", "eos_cli.main", *args]

    def env(self) -> dict[str, str]:
        """An environment in which nothing of the current tree leaks in."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONNOUSERSITE"] = "1"
        return env


def cache_root() -> Path:
    return Path(os.environ.get("EOS_RELEASES_CACHE", Path(sys.prefix) / "eos-releases"))


def install(release: Release) -> InstalledRelease:
    """The release installed in its own virtual environment (built once per commit)."""
    commit = _resolve(release.commit)
    root = cache_root() / f"{release.version}-{commit[:12]}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several test workers may ask at once
        if not (root / "installed").exists():
            _build(commit, root)
    return InstalledRelease(release, root)


def _resolve(commit: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(
            f"release commit {commit} is not in this clone's history ({out.stderr.strip()}); "
            "the upgrade tests need the repository's full history"
        )
    return out.stdout.strip()


def _build(commit: str, root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    src = root / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True, check=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # the venv's site-packages: same Python, same layout as this interpreter's
    site = venv / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    # the current environment's third-party packages (and pip, to install with)
    (site / "zz_eos_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-warn-script-location", str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (root / "installed").write_text(commit + "\n")
