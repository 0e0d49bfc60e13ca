"""Supervision of ``eos up``'s children: one dead service is restarted, the rest run on.

A local cluster is only worth running in the foreground if losing one process does not
take every other one down with it: failover between coordinators, or a client riding
out a node's restart, can then be watched on a laptop exactly as in production. So once
the cluster is ready, a service that exits (crash, OOM kill, ``kill -9``) is reported on
stderr with its exit code or signal, and started again after a delay that doubles with
each quick death (1 s, 2 s, 4 s ... up to 30 s) so that a service failing at once on
every start (a full disk, a port taken by something else) does not spin the CPU or
flood the terminal. A service that stayed up for a minute is taken to have been healthy,
and its next death starts the delays from 1 s again.

During the first start the supervisor does not restart anything: a service dying before
the cluster was ever ready is a configuration error to show at once, not to retry.

Each running service's pid is kept in ``<data-dir>/run/<service>.pid`` so that scripts
and tests can find (and kill) one particular service. The services themselves are
``eos_cli.launcher.ServiceProcess``, the same the tests and the benchmarks start.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

from eos_cli.launcher import ServiceProcess, describe_exit, stop_in_waves

Clock = Callable[[], float]
Report = Callable[[str], None]


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C): a foreground supervisor runs until it
    is set, then stops its children cleanly."""
    stopping = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopping


def report_to_stderr(line: str) -> None:
    """Plain stderr lines (no rich markup or wrapping), one event per line, so that a log
    collector or ``grep`` sees each death and restart whole."""
    print(line, file=sys.stderr, flush=True)


class RestartPolicy:
    """How long to wait before starting a dead service again.

    The delay doubles with each death that follows a short life, up to ``cap``; a service
    that had been up for ``reset_after`` seconds or more starts again at ``initial``. The
    clock is injectable so that the rule can be checked without waiting on it.
    """

    def __init__(
        self,
        *,
        initial: float = 1.0,
        cap: float = 30.0,
        reset_after: float = 60.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if not 0 < initial <= cap:
            raise ValueError("need 0 < initial <= cap")
        self.initial, self.cap, self.reset_after = initial, cap, reset_after
        self.clock = clock
        self.next_delay = initial
        self.started_at = clock()

    def started(self) -> None:
        """Note that the service has just been started (its uptime counts from now)."""
        self.started_at = self.clock()

    def uptime(self) -> float:
        return self.clock() - self.started_at

    def died(self) -> float:
        """Note a death; returns the delay before the next start."""
        if self.uptime() >= self.reset_after:
            self.next_delay = self.initial
        delay = self.next_delay
        self.next_delay = min(self.cap, delay * 2)
        return delay


@dataclass
class _Watch:
    """The supervisor's view of one service between two passes."""

    service: ServiceProcess
    policy: RestartPolicy
    restart_at: float | None = None  # set while dead and waiting out its backoff
    announce_ready: bool = False  # restarted, not yet seen ready


def default_policy(clock: Clock) -> RestartPolicy:
    """1 s doubling to 30 s, reset after a minute up."""
    return RestartPolicy(clock=clock)


class Supervisor:
    """Starts services, waits for them, and keeps them running until told to stop."""

    def __init__(
        self,
        services: Sequence[ServiceProcess],
        env: Mapping[str, str] | None = None,
        *,
        clock: Clock = time.monotonic,
        report: Report = report_to_stderr,
        policy: Callable[[Clock], RestartPolicy] = default_policy,
    ) -> None:
        self.services = list(services)
        self.env = env  # None: each service's own environment
        self.clock = clock
        self.report = report
        self._watches = [_Watch(s, policy(clock)) for s in self.services]

    def start(self, timeout: float = 120.0, stopping: Callable[[], bool] = lambda: False) -> None:
        """Start every service and wait until all answer ``/readyz``."""
        self.launch()
        self.wait_ready(timeout, stopping)

    def launch(self) -> None:
        """Start every service, without waiting for any."""
        for watch in self._watches:
            watch.service.launch(self.env)
            watch.policy.started()

    def wait_ready(self, timeout: float, stopping: Callable[[], bool] = lambda: False) -> None:
        """Wait until every service answers ``/readyz``.

        Raises RuntimeError if one exits meanwhile or the deadline passes, and returns
        early if ``stopping`` turns true (Ctrl-C during a slow first start)."""
        deadline = time.monotonic() + timeout
        waiting = [w.service for w in self._watches]
        while waiting and not stopping():
            for service in waiting:
                code = service.exit_code()
                if code is not None:
                    raise RuntimeError(
                        f"{service.name} {describe_exit(code)} while starting;"
                        f" see {service.log_path}"
                    )
            waiting = [service for service in waiting if not service.ready()]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(service.name for service in waiting)
                raise RuntimeError(f"not ready after {timeout:.0f}s: {names}")
            if waiting:
                time.sleep(0.1)

    def check(self) -> None:
        """One pass: report deaths, start again those whose delay is over, and say when a
        restarted service is ready. Never blocks for longer than one ``/readyz`` call."""
        for watch in self._watches:
            service = watch.service
            if watch.restart_at is None:
                code = service.exit_code()
                if code is not None:
                    self._died(watch, code)
                elif watch.announce_ready and service.ready():
                    watch.announce_ready = False
                    self.report(f"{service.name} is ready again at {service.url}")
            elif self.clock() >= watch.restart_at:
                self._restart(watch)

    def _died(self, watch: _Watch, code: int) -> None:
        service = watch.service
        uptime = watch.policy.uptime()
        delay = watch.policy.died()
        watch.restart_at = self.clock() + delay
        watch.announce_ready = False
        service.forget_pid()
        self.report(
            f"{service.name} (pid {service.pid}) {describe_exit(code)} after {uptime:.0f}s;"
            f" restarting it in {delay:g}s; the others keep running; see {service.log_path}"
        )

    def _restart(self, watch: _Watch) -> None:
        service = watch.service
        watch.restart_at = None
        try:
            service.launch(self.env)
        except OSError as exc:  # e.g. too many processes: wait longer and try again
            delay = watch.policy.died()
            watch.restart_at = self.clock() + delay
            self.report(f"{service.name} could not be started ({exc}); again in {delay:g}s")
            return
        watch.policy.started()
        watch.announce_ready = True
        self.report(f"{service.name} restarted (pid {service.pid})")

    def waiting(self) -> list[str]:
        """Names of the services that are dead and waiting out their delay."""
        return [w.service.name for w in self._watches if w.restart_at is not None]

    def run(self, stopping: Callable[[], bool], interval: float = 0.2) -> None:
        """Supervise until ``stopping`` turns true (set by the signal handlers)."""
        while not stopping():
            self.check()
            time.sleep(interval)

    def stop(self) -> None:
        """Stop every service: the coordinators, then the nodes they write markers to,
        each wave at once (``stop_in_waves``)."""
        for watch in self._watches:
            watch.restart_at = None
        stop_in_waves([watch.service for watch in self._watches])
