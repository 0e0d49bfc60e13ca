"""``eos up`` as a real subprocess: driven through the CLI and the SDK, stopped with
SIGTERM, started again with its data intact. CLI errors print the code, no traceback.
A service killed under it is reported and restarted while the others run on; the
restart delays are checked on a fake clock with real short-lived processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from eos_cli.launcher import ServiceProcess, describe_exit
from eos_cli.supervisor import RestartPolicy, Supervisor
from sdk import Consumer, TransactionalProducer
from tests.support.processes import free_port_base, wait_until


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def eos(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eos_cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


class Up:
    """``eos up`` as a child of the test: stdout and stderr in separate files, so that a
    test can tell the status lines from the reports of deaths and restarts."""

    def __init__(self, data_dir: Path, base: int, *extra: str) -> None:
        self.data_dir, self.base, self.extra = data_dir, base, extra
        self.log = data_dir.parent / "up.out"
        self.err = data_dir.parent / "up.err"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"http://127.0.0.1:{self.base}"

    def stderr(self) -> str:
        return self.err.read_text()

    def tails(self) -> str:
        """stdout, stderr and every service's log tail: what a failing test shows."""
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}"
            for p in sorted((self.data_dir / "logs").glob("*.log"))
        )
        return f"--- stdout\n{self.log.read_text()}\n--- stderr\n{self.stderr()}\n{logs}"

    def start(self, timeout: float = 90) -> None:
        with self.log.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eos_cli.main",
                    "up",
                    "--data-dir",
                    str(self.data_dir),
                    "--port-base",
                    str(self.base),
                    *self.extra,
                ],
                stdout=out,
                stderr=err,
            )

        def ready() -> bool:
            assert self.running(), f"eos up exited:\n{self.tails()}"
            return "cluster ready" in self.log.read_text()

        wait_until(ready, timeout=timeout, what="eos up to print 'cluster ready'")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pid(self, service: str) -> int:
        """The pid ``eos up`` keeps for a service (``coordinator-2``, ``node-1``)."""
        return int((self.data_dir / "run" / f"{service}.pid").read_text())

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return self.process.wait(timeout=60)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    cluster = Up(tmp_path / "data", free_port_base())
    yield cluster
    if cluster.running():
        cluster.stop()


@pytest.mark.slow
def test_up_cli_sdk_restart(up: Up) -> None:
    up.start()
    lines = up.log.read_text().splitlines()
    assert sum(line.startswith("node ") for line in lines) == 3
    assert any(line.startswith("coordinator 1") and up.bootstrap in line for line in lines)
    b = ("--bootstrap", up.bootstrap)

    assert eos("topics", "create", "events", "--partitions", "3", *b).returncode == 0
    produced = eos(
        "produce", "events", "--transactional-id", "cli-loader", *b, stdin="one\ntwo\nthree\n"
    )
    assert produced.returncode == 0, produced.stderr
    with TransactionalProducer(up.bootstrap, "sdk-writer") as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send("events", "four", partition=0)
        producer.begin_transaction()
        producer.send("events", "aborted", partition=1)
        producer.flush()
        producer.abort_transaction()
    consumed = eos("consume", "events", "--from-beginning", "--idle-timeout", "2", *b)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["four", "one", "three", "two"]

    missing = eos("transactions", "describe", "nobody", *b)
    assert missing.returncode == 1
    assert "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr and "Traceback" not in missing.stderr
    duplicate = eos("topics", "create", "events", *b)
    assert duplicate.returncode == 1 and "TOPIC_ALREADY_EXISTS" in duplicate.stderr

    assert up.stop() == 0
    assert "cluster stopped" in up.log.read_text()
    for port in (up.base, up.base + 11, up.base + 12, up.base + 13):
        assert port_free(port), f"port {port} still in use after SIGTERM"

    up.start()
    listed = eos("transactions", "list", *b)
    assert "cli-loader" in listed.stdout and "CompleteCommit" in listed.stdout
    with Consumer(up.bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([("events", p) for p in range(3)])
        seen: list[str] = []

        def everything() -> bool:
            seen.extend(str(r.value) for r in consumer.poll(timeout=0.5))
            return len(seen) >= 4

        wait_until(everything, timeout=30, what="the records written before the restart")
    assert sorted(seen) == ["four", "one", "three", "two"]


@pytest.mark.slow
def test_several_coordinators_need_postgresql(tmp_path: Path) -> None:
    refused = eos("up", "--coordinators", "2", "--data-dir", str(tmp_path / "d"))
    assert refused.returncode == 2
    assert "PostgreSQL" in refused.stderr


@pytest.mark.slow
def test_up_with_two_coordinators_on_postgresql_and_auth_on(tmp_path: Path) -> None:
    from tests.support.coordinators import temp_database

    base = free_port_base()
    with temp_database() as url:
        up = Up(
            tmp_path / "d",
            base,
            *("--coordinators", "2", "--nodes", "2", "--database-url", url, "--auth"),
        )
        try:
            up.start(timeout=150)
            text = up.log.read_text()
            assert "coordinator 2" in text and f"127.0.0.1:{base + 1}" in text
            assert "auth on: export EOS_TOKEN" in text
            token = (tmp_path / "d" / "admin-token").read_text().strip()
            assert token not in (tmp_path / "d" / "tokens.toml").read_text()
            for port in (base, base + 1):
                bootstrap = ["--bootstrap", f"http://127.0.0.1:{port}"]
                refused = eos("topics", "list", *bootstrap)
                assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
                listed = eos("--token", token, "topics", "list", *bootstrap)
                assert listed.returncode == 0 and "__consumer_offsets" in listed.stdout
        finally:
            if up.running():
                assert up.stop() == 0


def answers_ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def parent_of(pid: int) -> int:
    """The parent pid, from /proc (the field after the parenthesised command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def kill_and_watch_restart(up: Up, service: str, port: int, others: dict[str, int]) -> int:
    """SIGKILL one service of ``up``; check that it is reported, that ``eos up`` and the
    other services (same pids, still ready) carry on, and that it comes back on its
    port. Returns the delay ``eos up`` announced before restarting it."""
    assert up.process is not None
    name = service.replace("-", " ")
    pid = up.pid(service)
    assert parent_of(pid) == up.process.pid, f"{service}'s pid file names another process"
    survivors = {other: up.pid(other) for other in others}
    earlier = len(up.stderr())  # the reports of this death come after this point
    os.kill(pid, signal.SIGKILL)

    report = re.compile(
        rf"{name} \(pid {pid}\) was killed by SIGKILL after \d+s; restarting it in (\d+)s"
    )
    wait_until(
        lambda: report.search(up.stderr()) is not None,
        timeout=15,
        what=f"eos up to report the death of {name}",
    )
    assert up.running(), up.tails()
    for other, other_port in others.items():
        wait_until(partial(answers_ready, other_port), timeout=20, what=f"{other} ready")

    def back() -> bool:
        assert up.running(), up.tails()
        try:
            restarted = up.pid(service)
        except (FileNotFoundError, ValueError):
            return False
        return restarted != pid and answers_ready(port)

    wait_until(back, timeout=90, what=f"{name} to be restarted and ready")
    assert parent_of(up.pid(service)) == up.process.pid
    wait_until(
        lambda: f"{name} is ready again at http://127.0.0.1:{port}" in up.stderr()[earlier:],
        timeout=15,
        what=f"eos up to report {name} ready again",
    )
    for other, other_port in others.items():
        assert up.pid(other) == survivors[other], f"{other} was restarted too"
        # Ready, as the same process: a node coming back sets off a burst of work (ISR
        # changes, copies), so one slow answer on a loaded machine is no failure.
        wait_until(partial(answers_ready, other_port), timeout=20,
                   what=f"{other} ready after the restart")  # fmt: skip
        assert up.pid(other) == survivors[other], f"{other} was restarted too"
    assert up.running(), up.tails()
    match = report.search(up.stderr()[earlier:])
    assert match is not None
    return int(match.group(1))


@pytest.mark.slow
def test_up_restarts_a_dead_service_while_the_others_run_on(tmp_path: Path) -> None:
    """``eos up --coordinators 2``: SIGKILL coordinator 2, then node 1 (twice): each is
    reported on stderr and restarted, the rest of the cluster is never touched, and the
    second quick death of node 1 waits twice as long. Ctrl-C then stops everything."""
    from tests.support.coordinators import temp_database

    base = free_port_base()
    ports = {
        "coordinator-1": base,
        "coordinator-2": base + 1,
        "node-1": base + 11,
        "node-2": base + 12,
    }
    with temp_database() as url:
        up = Up(tmp_path / "d", base, "--coordinators", "2", "--nodes", "2", "--database-url", url)
        try:
            up.start(timeout=150)
            every = f"http://127.0.0.1:{base},http://127.0.0.1:{base + 1}"
            assert f"cluster ready: bootstrap {every} " in up.log.read_text()
            for node in ("node-1", "node-2"):
                argv = argv_of(up.pid(node))
                assert argv[argv.index("--coordinator-url") + 1] == every, argv

            def others(service: str) -> dict[str, int]:
                return {s: p for s, p in ports.items() if s != service}

            assert kill_and_watch_restart(
                up, "coordinator-2", base + 1, others("coordinator-2")
            ) == 1
            listed = eos("topics", "list", "--bootstrap", f"http://127.0.0.1:{base + 1}")
            assert listed.returncode == 0 and "__consumer_offsets" in listed.stdout

            assert kill_and_watch_restart(up, "node-1", base + 11, others("node-1")) == 1
            assert kill_and_watch_restart(up, "node-1", base + 11, others("node-1")) == 2
            argv = argv_of(up.pid("node-1"))
            assert argv[argv.index("--coordinator-url") + 1] == every

            pids = [up.pid(service) for service in ports]
            assert up.stop(signal.SIGINT) == 0, up.tails()
            assert "cluster stopped" in up.log.read_text()
            assert not list((tmp_path / "d" / "run").glob("*.pid"))
            for pid in pids:
                assert not Path(f"/proc/{pid}").exists(), f"pid {pid} outlived eos up"
            for port in ports.values():
                assert port_free(port), f"port {port} still in use after Ctrl-C"
        finally:
            if up.running():
                up.stop()


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.slow
def test_services_stop_when_eos_up_is_killed(up: Up) -> None:
    """SIGKILL of ``eos up`` itself, which cannot stop its services: each sees its
    supervisor gone and stops (``eos_server/parent_watch.py``), freeing its port for the
    next ``eos up``, instead of running on as an unsupervised orphan."""
    up.start()
    services = ["coordinator-1", "node-1", "node-2", "node-3"]
    pids = {name: up.pid(name) for name in services}
    assert up.stop(signal.SIGKILL) == -signal.SIGKILL

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie is dead: its parent, init here, reaps it when it gets to it
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    wait_until(lambda: not any(alive(pid) for pid in pids.values()), timeout=30,
               what=f"the services of the killed eos up to stop: {pids}")  # fmt: skip
    wait_until(lambda: port_free(up.base) and port_free(up.base + 11), timeout=10,
               what="their ports to be free")  # fmt: skip
    logs = (up.data_dir / "logs" / "node-1.log").read_text()
    assert "its supervisor" in logs and "is gone; stopping" in logs, logs[-2000:]


@pytest.mark.unit
def test_backoff_doubles_to_a_cap_and_starts_over_after_a_long_life() -> None:
    clock = FakeClock()
    policy = RestartPolicy(clock=clock)
    delays = []
    for _ in range(8):
        policy.started()
        clock.advance(0.5)
        delays.append(policy.died())
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    policy.started()
    clock.advance(59.9)
    assert policy.died() == 30, "a life just short of a minute does not reset the delay"
    policy.started()
    clock.advance(60)
    assert policy.died() == 1, "a minute up resets the delay"
    policy.started()
    clock.advance(1)
    assert policy.died() == 2
    with pytest.raises(ValueError):
        RestartPolicy(initial=5, cap=1)


def test_supervisor_restarts_a_real_process_on_a_fake_clock(tmp_path: Path) -> None:
    """Real processes, a fake clock: a process that exits at once is restarted exactly
    when its delay is over and not before, a long-lived neighbour is left alone, and
    stop() ends everything and removes the pid files."""
    clock = FakeClock()
    lines: list[str] = []
    starts = tmp_path / "starts"
    crasher = ServiceProcess(
        "crasher",
        [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(3)"],
        port=9,
        log_path=tmp_path / "logs" / "crasher.log",
        pid_path=tmp_path / "run" / "crasher.pid",
    )
    steady = ServiceProcess(
        "steady",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        port=9,
        log_path=tmp_path / "logs" / "steady.log",
        pid_path=tmp_path / "run" / "steady.pid",
    )
    supervisor = Supervisor([crasher, steady], dict(os.environ), clock=clock, report=lines.append)
    try:
        supervisor.launch()
        steady_pid = steady.pid
        assert (tmp_path / "run" / "steady.pid").read_text().strip() == str(steady_pid)

        def died_and_reported(starts_so_far: int, delay: int) -> None:
            pid = crasher.pid
            wait_until(lambda: crasher.exit_code() is not None, what="the crasher to exit")
            assert starts.read_text() == "x" * starts_so_far
            supervisor.check()
            assert lines[-1].startswith(f"crasher (pid {pid}) exited with code 3 after ")
            assert f"restarting it in {delay}s" in lines[-1]
            assert supervisor.waiting() == ["crasher"]
            assert not (tmp_path / "run" / "crasher.pid").exists()
            clock.advance(delay - 0.1)
            supervisor.check()
            assert supervisor.waiting() == ["crasher"], "restarted before its delay was over"
            clock.advance(0.1)
            supervisor.check()
            assert supervisor.waiting() == []
            assert crasher.pid != pid and lines[-1] == f"crasher restarted (pid {crasher.pid})"
            assert (tmp_path / "run" / "crasher.pid").read_text().strip() == str(crasher.pid)

        died_and_reported(1, 1)
        died_and_reported(2, 2)
        died_and_reported(3, 4)
        clock.advance(60)  # as if this last run had been up for a minute
        died_and_reported(4, 1)
        assert steady.alive() and steady.pid == steady_pid
        assert not any("steady" in line for line in lines)
    finally:
        supervisor.stop()
    assert not steady.alive() and steady.exit_code() == -signal.SIGTERM
    assert not list((tmp_path / "run").glob("*.pid"))


@pytest.mark.unit
def test_describe_exit() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
