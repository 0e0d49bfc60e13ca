"""A service started by a supervisor stops when the supervisor is gone.

``eos up``, ``eos coordinator --instances K`` and the test and benchmark launchers start
services as child processes and restart them when they die. A supervisor that is itself
killed (SIGKILL, an out-of-memory kill, a crashed test worker) cannot stop them: they
would run on unsupervised as orphans, holding their ports, so that the next ``eos up`` on
the same ports fails, and each keeps spending CPU on its loops. The launcher therefore
names itself in ``EOS_PARENT_PID``; a service that finds its parent changed (the kernel
hands an orphan to init or a subreaper) stops as on SIGTERM: gracefully, its logs
flushed. A service started by hand, by systemd or in a container has no such variable
and is never affected.

Apart from ``process.py`` so that the launcher (and every ``eos`` command that loads it)
reads ``PARENT_PID_ENV`` without importing FastAPI.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping

log = logging.getLogger("eos.process")

#: The variable the launcher sets to its own process id.
PARENT_PID_ENV = "EOS_PARENT_PID"
#: How often the parent is looked at: an orphan stops within about this long.
CHECK_INTERVAL_S = 1.0


def supervisor_pid(environ: Mapping[str, str] | None = None) -> int | None:
    """The supervisor this process was started by, if it was started by one."""
    value = (os.environ if environ is None else environ).get(PARENT_PID_ENV, "")
    return int(value) if value.strip().isdigit() and int(value) > 1 else None


def watch_parent(service: str) -> threading.Thread | None:
    """Stop this process (SIGTERM to itself) once its supervisor is gone. Returns the
    watching thread, or None when there is no supervisor to watch."""
    expected = supervisor_pid()
    if expected is None:
        return None
    if os.getppid() != expected:
        # started by someone else than the named process (a wrapper shell, say): the
        # variable says nothing about our parent, so nothing is watched
        log.warning("%s: %s=%d is not this process's parent; not watching it",
                    service, PARENT_PID_ENV, expected)  # fmt: skip
        return None

    def watch() -> None:
        while True:
            time.sleep(CHECK_INTERVAL_S)
            if os.getppid() != expected:
                log.warning("%s: its supervisor (pid %d) is gone; stopping", service, expected)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
