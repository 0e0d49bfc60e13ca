"""CPU-seconds per test, services and JVMs included: ``EOS_TEST_CPU=1 bash scripts/test.sh``.

The parallel phase is bound by the machine's two cores, not by any lane (the workers are
busy for nearly all of it), so what makes the suite slow is what its tests burn, wherever
they burn it: in the test process, in the services it starts (forked by the zygote), in
Spark's JVMs and Python workers, in the Jepsen hosts' processes. Wall time cannot tell
these apart under load, and a per-process count misses the processes that come and go.

So each test process moves itself into a control group of its own (cgroup v1 ``cpuacct``
or v2 ``cpu.stat``); every process it starts afterwards is born inside it, and the group's
counter read before and after a test is that test's CPU time, whatever ran it. A module's
fixture is counted where it is set up (its first test) and torn down (its last). Processes
outside the test's tree are not counted: the system's PostgreSQL (the tests' databases)
and podman's containers (the compose run).

The controller prints the tests and modules that burned most, and the total. Enabled only
when asked: moving processes between groups needs root, and a run that cannot do it says
so once and goes on uncounted.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ENV = "EOS_TEST_CPU"
#: Lines of each list at the end of the run.
SHOWN = 25
_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = Path("/sys/fs/cgroup")
_KEY = "cpu_s"


class _Group:
    """This process's control group and its CPU counter, in seconds."""

    def __init__(self, name: str) -> None:
        if (_V1 / "cpuacct.usage").exists():
            self.path, self._v2 = _V1 / "eos-tests" / name, False
        elif (_V2 / "cgroup.controllers").exists():
            self.path, self._v2 = _V2 / "eos-tests" / name, True
        else:
            raise OSError("no cgroup cpuacct (v1) or cpu.stat (v2) hierarchy")
        for old in self.path.parent.glob("*-*"):  # earlier runs' groups, empty by now
            with contextlib.suppress(OSError):
                old.rmdir()
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def leave(self) -> None:
        """Back to the hierarchy's root, and the group removed when nothing is left in
        it (the zygote, stopped later, keeps it: the next run removes it)."""
        (self.path.parents[1] / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def seconds(self) -> float:
        if self._v2:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
            raise OSError("cpu.stat has no usage_usec")
        return int((self.path / "cpuacct.usage").read_text()) / 1e9


_STARTED = pytest.StashKey[float]()


class _Counter:
    """In a test process: each test's CPU-seconds, setup to teardown, handed to the
    controller as a user property of its teardown report (xdist carries those back)."""

    def __init__(self, group: _Group) -> None:
        self.group = group

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        item.stash[_STARTED] = self.group.seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        if report.when == "teardown" and _STARTED in item.stash:
            report.user_properties.append((_KEY, self.group.seconds() - item.stash[_STARTED]))


class _Totals:
    """In the controller (or a run without workers): the CPU-seconds reported per test."""

    def __init__(self) -> None:
        self.tests: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _KEY:
                self.tests[report.nodeid] = float(value)  # type: ignore[arg-type]

    def lines(self) -> list[str]:
        modules: defaultdict[str, float] = defaultdict(float)
        for nodeid, seconds in self.tests.items():
            modules[nodeid.split("::", 1)[0]] += seconds
        total = sum(self.tests.values())
        out = [f"{total:.0f} CPU-seconds in {len(self.tests)} tests; the most:"]
        out += _most(self.tests)
        out.append("modules:")
        return out + _most(modules)


def _most(seconds: dict[str, float]) -> list[str]:
    ranked = sorted(seconds.items(), key=lambda item: -item[1])[:SHOWN]
    return [f"{value:7.1f}  {name}" for name, value in ranked]


_TOTALS = pytest.StashKey[_Totals]()
_GROUP = pytest.StashKey[_Group]()


@pytest.hookimpl(tryfirst=True)  # before the zygote starts: its services must be born inside
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(ENV, "") in ("", "0"):
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    runs_tests = worker is not None or not config.getoption("numprocesses", None)
    if runs_tests:
        try:
            group = _Group(f"{os.getppid() if worker else os.getpid()}-{worker or 'main'}")
        except OSError as exc:
            print(f"{ENV}: not counting CPU per test: {exc}")
        else:
            config.pluginmanager.register(_Counter(group), "eos-cpu-counter")
            config.stash[_GROUP] = group
    if worker is None:
        totals = config.stash[_TOTALS] = _Totals()
        config.pluginmanager.register(totals, "eos-cpu-totals")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    totals = config.stash.get(_TOTALS, None)
    if totals is None or not totals.tests:
        return
    terminalreporter.write_sep("=", "CPU-seconds per test (services and JVMs included)")
    for line in totals.lines():
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    group = config.stash.get(_GROUP, None)
    if group is not None:
        with contextlib.suppress(OSError):
            group.leave()
