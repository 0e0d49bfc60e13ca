"""How the tests are spread over pytest-xdist workers (``-n N --dist loadgroup``).

Most tests are independent and go to whichever worker is free, one at a time. Some must
share a worker:

* the tests of a module-scoped fixture (a cluster, a Spark session, a node): a fixture is
  set up once on every worker that runs one of its tests, so spread over four workers a
  module's cluster would be started four times;
* the tests of an ``xdist_group`` lane, which run one after the other because side by
  side they would squeeze each other past their time limits: the Spark jobs (``spark``)
  and the chaos fault cases (``chaos``).

pytest-xdist's own ``--dist loadgroup`` cannot do this with pytest 9: it renames each
test id (``id@group``) through an attribute pytest 9 no longer reads, so its groups are
silently ignored and every test is spread. So ``loadgroup`` is served here by xdist's
``loadscope`` scheduler with its own idea of a scope: a test's group if it has one, else
the test itself. The groups are known only where tests are collected, in the workers:
each worker writes them (test id -> group) to the file named by ``EOS_TEST_GROUPS``,
which the controller made before starting them, and the scheduler reads it once every
worker has collected (xdist checks that they all collected the same tests). The largest
scopes are handed out first (``loadscope``'s reordering), and the lanes of
``FIRST_LANES`` before all of them, longest first: a lane is a serial chain, and one
started late ends the run late (the streaming Spark lane, nine tests, was handed out after
the modules of more tests and finished half an hour after the rest). Started at once, the
lanes run beside the single tests, which fill the gaps around them.

At the end of a parallel run the controller prints how long each lane took in all (its
tests' setup, call and teardown) and how busy each worker was: a lane is a serial chain,
so the phase can be no shorter than its longest lane, and a worker far less busy than the
others shows time lost to the order in which work was handed out.

Registered as a plugin by ``tests/conftest.py``, which the controller loads (a package's
own conftest is not: the controller collects nothing).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ENV = "EOS_TEST_GROUPS"
_FILE = pytest.StashKey[Path]()  # the controller's groups file
_TIMES = pytest.StashKey["LaneTimes"]()
#: Lanes listed at the end of a run.
LANES_SHOWN = 8
#: The chaos fault cases' two lanes (``tests/chaos/test_faults.py``).
CHAOS_LANES = ("chaos", "chaos-2")
#: The tests marked ``heavy`` (the compose project's image build and run, the Spark
#: standalone cluster): one lane, one test at a time. They used to run alone after the
#: parallel phase, four to five minutes in which the machine was half idle (waiting on
#: image layers, health checks and JVMs); as a lane handed out first they fill the gaps
#: of the rest instead.
HEAVY_LANE = "heavy"
#: The lanes that take longest, longest first (beside the rest of the suite: about 5, 6,
#: 5, 5, 5 and 1 minutes): handed out before everything else.
#: The Jepsen-style runs on namespaced hosts (``tests/jepsen``): the short run with every
#: fault kind, and the planted bugs.
JEPSEN_LANES = ("jepsen", "jepsen-planted")
FIRST_LANES = (
    HEAVY_LANE, "spark-streaming", *JEPSEN_LANES, *CHAOS_LANES, "spark", "retention-soak"
)


def group_of(item: pytest.Item) -> str | None:
    """The worker a test must share: the heavy lane, its ``xdist_group`` lane, else its
    module when it uses a module- or class-scoped fixture, else none."""
    if item.get_closest_marker("heavy") is not None:
        return HEAVY_LANE
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
    if scopes & {"module", "class"}:
        return item.nodeid.split("::", 1)[0]
    return None


class GroupScheduling(LoadScopeScheduling):
    """``loadscope`` whose scope of a test is its group, or the test alone."""

    def __init__(self, config: pytest.Config, log: Any, groups: Path) -> None:
        super().__init__(config, log)
        self._groups_file = groups
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            text = self._groups_file.read_text() if self._groups_file.exists() else "{}"
            self._groups = json.loads(text)
        return self._groups.get(nodeid, nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        for lane in reversed(FIRST_LANES):
            if lane in self.workqueue:
                self.workqueue.move_to_end(lane, last=False)
        super()._assign_work_unit(node)


class LaneTimes:
    """The seconds each test id and each worker spent, gathered from the workers'
    reports in the controller."""

    def __init__(self) -> None:
        self.tests: defaultdict[str, float] = defaultdict(float)
        self.workers: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tests[report.nodeid] += report.duration
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if worker is not None:
            self.workers[str(worker)] += report.duration

    def lines(self, groups: dict[str, str]) -> list[str]:
        lanes: defaultdict[str, float] = defaultdict(float)
        for nodeid, seconds in self.tests.items():
            group = groups.get(nodeid)
            if group is not None:
                lanes[group] += seconds
        longest = sorted(lanes.items(), key=lambda item: -item[1])[:LANES_SHOWN]
        out = [f"{seconds:7.0f} s  {lane}" for lane, seconds in longest]
        busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(self.workers.items()))
        return [*out, f"busy: {busy}"]


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _loadgroup(config: pytest.Config) -> bool:
    return bool(config.getoption("numprocesses", None)) and (
        config.getoption("dist", "no") == "loadgroup"
    )


def pytest_configure(config: pytest.Config) -> None:
    if _is_worker(config) or not _loadgroup(config):
        return
    handle, name = tempfile.mkstemp(prefix="eos-test-groups-", suffix=".json")
    os.close(handle)
    os.unlink(name)  # written by the workers; absent: no group at all
    os.environ[ENV] = name  # the workers are started after this, with this environment
    config.stash[_FILE] = Path(name)
    times = config.stash[_TIMES] = LaneTimes()
    config.pluginmanager.register(times, "eos-lane-times")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    times = config.stash.get(_TIMES, None)
    path = config.stash.get(_FILE, None)
    if times is None or path is None or not path.exists():
        return
    terminalreporter.write_sep("=", "longest lanes (setup + call + teardown, in all)")
    for line in times.lines(json.loads(path.read_text())):
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_FILE, None)
    if path is not None:
        path.unlink(missing_ok=True)
        os.environ.pop(ENV, None)


@pytest.hookimpl(trylast=True)  # after every other hook has added its markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = os.environ.get(ENV)
    if not (_is_worker(config) and target):
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    scratch = Path(f"{target}.{config.workerinput['workerid']}")  # type: ignore[attr-defined]
    scratch.write_text(json.dumps(groups))
    scratch.replace(target)  # atomic: the scheduler never reads half a file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    path = config.stash.get(_FILE, None)
    return GroupScheduling(config, log, path) if path is not None else None

