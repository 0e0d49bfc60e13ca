"""The guard of the ``unit`` layer: a test marked ``unit`` starts no process, opens no
network connection, listens on no port and touches no database.

``-m unit`` promises a run of seconds on any machine, with nothing installed but Python:
no PostgreSQL, no free ports, no Java. A marker is only a claim, so while a unit test
sets up and runs, the ways out of the process are replaced by tripwires: starting a
process (``subprocess.Popen``, ``os.fork``, ``os.system``, ``os.posix_spawn``), a socket
``connect``/``bind`` (HTTP clients and servers, the PostgreSQL and Spark drivers that go
through Python sockets), ``psycopg`` (whose C library opens its own sockets) and
``sqlite3.connect``. A tripwire raises at the call, and the test fails even if the code
under test swallowed that error, because the violation is recorded and checked once the
phase is over.

Only the test's own work counts. Threads left running by earlier tests of the same
worker (a cluster's helper loop, a client's sender) may do what they like while a unit
test runs: they are told apart by being alive before the unit test started and not
having been started by an earlier unit test. The main thread, and any thread a unit
test starts, are always watched. Fixture teardown is not watched: a session fixture of
the other layers may be torn down after the last unit test of a worker.

The plugin is registered by ``tests/conftest.py``; ``tests/test_unit_guard.py`` plants
violations and checks that each one fails its test.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

_MISSING = object()


class UnitLayerViolation(Exception):
    """Raised where a unit test reaches out of its process; the test fails on it."""


class UnitGuard:
    """The pytest plugin: tripwires around the setup and call of every ``unit`` test."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._unit_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._before: set[threading.Thread] = set()

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line(
            "markers", "unit: no processes, no database, no network: the layer that runs in seconds"
        )

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        """Under ``-m unit`` (alone or and-ed with more) skip the test modules that mark
        nothing ``unit``: importing them (FastAPI apps, Spark helpers, schemathesis) was
        half the layer's time, and none of their tests could be selected."""
        if not _requires_unit(str(config.option.markexpr or "")):
            return None
        name = collection_path.name
        if collection_path.suffix != ".py" or not name.startswith("test_"):
            return None
        return "mark.unit" not in collection_path.read_text(encoding="utf-8")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._guarded(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._guarded(item, "call"))

    def _guarded(self, item: pytest.Item, phase: str) -> Generator[None, None, None]:
        if item.get_closest_marker("unit") is None:
            return (yield)
        self.violations = []
        self._before = set(threading.enumerate())
        try:
            with self._tripwires():
                result = yield
        finally:
            self._unit_threads.update(set(threading.enumerate()) - self._before)
        if self.violations:
            found = "\n  ".join(dict.fromkeys(self.violations))
            raise UnitLayerViolation(
                f"{item.nodeid} is marked unit but during {phase} it\n  {found}\n"
                "Move it to another layer (drop the unit marker) or fake what it reaches."
            )
        return result

    def _watched(self) -> bool:
        """Whether the calling thread's work belongs to the unit test that runs."""
        thread = threading.current_thread()
        return (
            thread is threading.main_thread()
            or thread not in self._before
            or thread in self._unit_threads
        )

    def _tripwire(self, original: Any, what: Callable[..., str]) -> Callable[..., Any]:
        guard = self

        def tripped(*args: Any, **kwargs: Any) -> Any:
            if not guard._watched():
                return original(*args, **kwargs)
            message = what(*args, **kwargs)
            guard.violations.append(message)
            raise UnitLayerViolation(message)

        return tripped

    @contextmanager
    def _tripwires(self) -> Iterator[None]:
        patches: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, what: Callable[..., str], *, bound: bool = False) -> None:
            saved = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(
                owner, name, _MISSING
            )
            if saved is _MISSING and not isinstance(owner, type):
                return  # not on this platform
            original = getattr(owner, name)
            tripped = self._tripwire(original, what)
            setattr(owner, name, classmethod(lambda _cls, *a, **k: tripped(*a, **k))
                    if bound else tripped)  # fmt: skip
            patches.append((owner, name, saved))

        patch(subprocess.Popen, "__init__",
              lambda _self, args, *a, **k: f"starts a process: {_argv(args)}")
        for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
            patch(os, name, lambda *a, _n=name, **k: f"starts a process (os.{_n})")
        patch(socket.socket, "connect", _connect_message)
        patch(socket.socket, "connect_ex", _connect_message)
        patch(socket.socket, "bind", _bind_message)
        patch(psycopg, "connect", lambda *a, **k: "opens a PostgreSQL connection")
        for cls in (psycopg.Connection, psycopg.AsyncConnection):
            patch(cls, "connect", lambda *a, **k: "opens a PostgreSQL connection", bound=True)
        # SQLAlchemy's driver calls ``sqlite3.dbapi2.connect``, an attribute of its own
        for module in (sqlite3, sqlite3.dbapi2):
            patch(module, "connect", lambda db, *a, **k: f"opens an SQLite database {db}")
        try:
            yield
        finally:
            for owner, name, saved in reversed(patches):
                if saved is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, saved)


def _requires_unit(markexpr: str) -> bool:
    """Whether a ``-m`` expression selects only ``unit`` tests: ``unit`` and-ed at its
    top level (``unit``, ``(unit) and not heavy``), with no ``or`` anywhere. Anything else
    is left to pytest."""
    if re.search(r"\bor\b", markexpr):
        return False
    return re.fullmatch(r"\s*\(?\s*unit\s*\)?\s*(and\s.*)?", markexpr, re.DOTALL) is not None


def _argv(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return str(args)
    return " ".join(str(a) for a in args)[:200]


def _address(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _connect_message(sock: socket.socket, address: Any) -> str:
    sock.close()  # the caller's cleanup expects an OSError, not this: no socket left behind
    return f"opens a connection to {_address(address)}"


def _bind_message(sock: socket.socket, address: Any) -> str:
    sock.close()
    if sock.family == socket.AF_UNIX:
        return f"binds a Unix socket at {address}"
    return f"listens on {_address(address)}"
