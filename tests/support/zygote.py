"""Service processes forked from one that has imported the services already.

The suite starts hundreds of coordinators and storage nodes, and each ``python -m
coordinator_service`` spent about a CPU-second importing FastAPI, SQLAlchemy, Alembic,
pydantic and the service's own modules before it served anything (a node about 0.6 s,
measured with ``python -X importtime``): on a two-core machine that ran the suite
CPU-bound, a fifth of all the CPU it used. So each test worker keeps one *zygote*: a
process that imports the services once, then forks one child per service the tests
start. The child is a real process of its own (its own pid, log, session when asked,
signals, SIGKILL, exit code); it runs ``python -m <module> <args>`` as the command line
would have, in the environment and working directory the launcher gave it.

The launcher asks the zygote through its seam (``eos_cli.launcher.SPAWNER``); anything
but ``<this interpreter> -m <a preloaded service>`` is left to ``subprocess.Popen``.
Only the zygote can reap its children, so the handle the launcher gets
(``ForkedProcess``) asks it for an exit code; a signal goes straight to the child.
``EOS_PARENT_PID`` names the zygote, the child's parent: the zygote exits when its test
worker does (its request pipe closes), and a service whose parent is gone stops itself
(``eos_server.parent_watch``). ``EOS_TEST_FORK=0`` turns it off.

Run as ``python -m tests.support.zygote``: requests are JSON lines on stdin, answers JSON
lines on stdout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from eos_cli.launcher import SPAWNER
from eos_server.parent_watch import PARENT_PID_ENV

#: The services a zygote can start (and the chaos suite's clients, which import the SDK),
#: and what it imports for them before its first fork.
SERVICES = ("coordinator_service", "partition_service", "tests.chaos.copier", "tests.chaos.reader")
PRELOAD = (
    "typer", "coordinator_service.cli", "coordinator_service.app",
    "partition_service.cli", "partition_service.app", "sdk", "tests.chaos.history",
)  # fmt: skip
#: How often a wait asks the zygote whether its child has exited.
POLL_S = 0.02
OFF_ENV = "EOS_TEST_FORK"
ROOT = Path(__file__).resolve().parents[2]  # where ``-m tests.support.zygote`` is found


def install() -> Zygote | None:
    """This process's zygote, put in the launcher's seam (None under ``EOS_TEST_FORK=0``).
    It starts at the first service a test starts."""
    if os.environ.get(OFF_ENV) == "0":
        return None
    zygote = Zygote()
    SPAWNER.append(zygote.spawn)
    return zygote


# --- in the zygote ---------------------------------------------------------------------


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m module args``; never returns."""
    code = 1
    try:
        if request["own_session"]:
            os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)  # the zygote's request pipe, closed for the child
        os.dup2(log, 1)  # its answer pipe
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["args"]]
        code = 0
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken log: nothing to save
                stream.flush()
        os._exit(code)


def _answer(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def serve() -> None:
    """The zygote's loop: import, then fork on request until the worker goes away."""
    for module in PRELOAD:
        importlib.import_module(module)
    if threading.active_count() != 1:  # a fork copies the forking thread alone
        raise RuntimeError("a preloaded module started a thread; the zygote cannot fork")
    exited: dict[int, int] = {}
    _answer({"ready": os.getpid()})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            _answer({"pid": pid})
        elif request["op"] == "poll":
            pid = request["pid"]
            if pid not in exited:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 255 << 8  # never ours, or reaped: report it ended
                if done:
                    exited[pid] = os.waitstatus_to_exitcode(status)
            _answer({"returncode": exited.get(pid)})


# --- in the test worker ----------------------------------------------------------------


class Zygote:
    """A test worker's zygote, started at its first use and again if it died."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.pid = 0

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is not None:
            # its children stopped with it (their parent is gone): say so where a red run
            # can be explained from, the worker's other tests being unaware of it
            note = (f"{time.strftime('%H:%M:%S')} zygote {self._process.pid} of "
                    f"{os.environ.get('PYTEST_XDIST_WORKER', 'pytest')} ended "
                    f"({self._process.returncode}); started again\n")  # fmt: skip
            with (Path(tempfile.gettempdir()) / "eos-zygote.log").open("a") as log:
                log.write(note)
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            self._process = None
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.zygote"], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
            self.pid = int(self._read(self._process)["ready"])
        return self._process

    @staticmethod
    def _read(process: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited ({process.poll()}): see the test's stderr")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request, one answer; asked again of a new zygote if this one died (a spawn
        had not happened; a poll of the old one's child is answered as ended)."""
        with self._lock:
            for attempt in (1, 2):
                process = self._started()
                assert process.stdin is not None
                try:
                    process.stdin.write((json.dumps(request) + "\n").encode())
                    process.stdin.flush()
                    return self._read(process)
                except (OSError, RuntimeError):
                    if attempt == 2:
                        raise
                    process.wait(timeout=10)  # gone: the next round starts another
            raise AssertionError("unreachable")

    def spawn(
        self, argv: list[str], env: dict[str, str], log_path: Path, own_session: bool
    ) -> ForkedProcess | None:
        """The launcher's spawner: a forked ``python -m <service>``, else None."""
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            return None
        if argv[2] not in SERVICES:
            return None
        with self._lock:
            self._started()
            zygote_pid = self.pid
        request = {
            "op": "spawn", "module": argv[2], "args": argv[3:], "own_session": own_session,
            "env": {**env, PARENT_PID_ENV: str(zygote_pid)}, "log_path": str(log_path),
            "cwd": os.getcwd(),
        }  # fmt: skip
        return ForkedProcess(self, int(self.ask(request)["pid"]), argv)

    def close(self) -> None:
        with self._lock:
            if self._process is not None:
                assert self._process.stdin is not None
                self._process.stdin.close()
                self._process.wait(timeout=10)
                if self._process.stdout is not None:
                    self._process.stdout.close()
                self._process = None


class ForkedProcess:
    """A zygote's child, handled as ``subprocess.Popen`` handles its own."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.ask({"op": "poll", "pid": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(POLL_S)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # unreaped until polled: the pid is still this child's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve()
