"""The network of a Jepsen-style run: one Linux network namespace per host, and faults
made of blackhole routes.

A partition test needs hosts that can lose each other while the test itself still sees
every one of them. Processes on loopback cannot be told apart by address, and the fault
proxies of ``tests.support.proxy`` only cut what is routed through them; a namespace per
host gives each service its own address, its own port 8080 and its own routing table, so
any link between two hosts can be cut without the services knowing it is a test.

The layout: a bridge in the root namespace owning ``control_address`` (``.1`` of a /24
picked free among ``10.100-250.x.0/24``), and each host a namespace with ``lo`` up and one
veth ``eth0`` on that bridge. The test process, in the root namespace, reaches every host
through the bridge; no fault ever names the control address, so the test keeps its view
whatever the nemesis did.

Faults are blackhole routes, as ``tc`` and netfilter need kernel modules this machine
cannot load: a blackhole route in A's namespace for B's /32 loses everything A sends to
B. A's own ``connect()`` to B then fails at once (EINVAL), and B's ``connect()`` to A
hangs, A's SYN-ACK being lost: ``drop`` is one direction, ``cut`` both.

Several runs may exist at once (pytest-xdist workers), and a killed run leaves its
namespaces behind. So every name carries a short random tag (interface names have at most
15 characters), each run records its pid and subnet in ``/run/eos-jepsen/<tag>.json``
before it makes anything, subnets are picked under a lock, and each new ``Network`` first
removes what runs whose process is dead left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

#: Every namespace, link and scratch directory of a run starts with this (and its tag).
PREFIX = "eosj"
#: Where runs record who made them, so that a later run can clean up after a dead one.
RECORDS = Path("/run/eos-jepsen")
#: The second octets a run's /24 may take (10.<octet>.<x>.0/24).
SECOND_OCTETS = range(100, 251)
IP_TIMEOUT_S = 30.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


def _ip_binary() -> str | None:
    """``ip`` lives in /usr/sbin, which a bare environment's PATH may leave out."""
    return shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin")


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip <args>`` and return its output; ``RuntimeError`` with its stderr if it
    fails (and ``check``)."""
    binary = _ip_binary()
    if binary is None:
        raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
    done = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@functools.cache
def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they can. Probes once, by making
    a namespace with a veth into it and deleting both."""
    if os.geteuid() != 0:
        return f"network namespaces need root (the test runs as uid {os.geteuid()})"
    if _ip_binary() is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    veth = f"{PREFIX}p{os.getpid() % 1_000_000}"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return f"`ip netns add` is refused: {error}"
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return f"a veth pair cannot be made: {error}"
    finally:
        ip("link", "del", veth, check=False)
        ip("netns", "del", probe, check=False)
    return None


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of its stat), None if it is gone: a
    pid with another start time is a reused pid, not the run's process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def namespace_pids(namespace: str) -> list[int]:
    """The processes in ``namespace`` now."""
    return [int(pid) for pid in ip("netns", "pids", namespace, check=False).split()]


def kill_namespace(namespace: str) -> None:
    """SIGKILL every process in ``namespace``: deleting a namespace kills nothing, and a
    PostgreSQL backend outlives its killed postmaster for a while."""
    for pid in namespace_pids(namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _links() -> list[str]:
    return [entry["ifname"] for entry in json.loads(ip("-j", "link", "show") or "[]")]


def _remove_run(tag: str) -> None:
    """Everything of run ``tag``: its processes, namespaces, links, scratch directories
    and record. Each step goes on whatever the one before it found."""
    for namespace in _namespaces():
        if namespace.startswith(f"{PREFIX}-{tag}-"):
            kill_namespace(namespace)
            ip("netns", "del", namespace, check=False)
    for link in _links():
        if link.startswith(f"{PREFIX}{tag}"):
            ip("link", "del", link, check=False)
    for scratch in Path(tempfile.gettempdir()).glob(f"{PREFIX}-{tag}-*"):
        shutil.rmtree(scratch, ignore_errors=True)
    (RECORDS / f"{tag}.json").unlink(missing_ok=True)


def cleanup_leftovers() -> list[str]:
    """Remove what runs whose process is dead left behind; returns their tags."""
    for namespace in _namespaces():  # a probe's, if its process died during the probe
        pid = namespace.removeprefix(f"{PREFIX}-probe-")
        if pid != namespace and pid.isdigit() and _start_time(int(pid)) is None:
            ip("link", "del", f"{PREFIX}p{int(pid) % 1_000_000}", check=False)
            ip("netns", "del", namespace, check=False)
    removed = []
    for record in sorted(RECORDS.glob("*.json")):
        try:
            owner = json.loads(record.read_text())
            alive = _start_time(int(owner["pid"])) == owner["start_time"]
        except (OSError, ValueError, KeyError, TypeError):
            alive = False
        if not alive:
            _remove_run(record.stem)
            removed.append(record.stem)
    return removed


@contextlib.contextmanager
def _records_locked() -> Iterator[None]:
    """Runs pick their subnets one at a time, or two could take the same one."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    with (RECORDS / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _taken_subnets() -> set[ipaddress.IPv4Network]:
    """Every /24 an address of the root namespace is in, and every recorded run's."""
    taken = set()
    for entry in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for info in entry.get("addr_info", []):
            taken.add(ipaddress.IPv4Network(f"{info['local']}/24", strict=False))
    for record in RECORDS.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            taken.add(ipaddress.IPv4Network(json.loads(record.read_text())["subnet"]))
    return taken


@dataclass(frozen=True)
class Host:
    """A host of the run: its namespace and its one address."""

    name: str
    namespace: str
    address: str


class Network:
    """A bridge and a namespace per host, with blackhole-route faults between hosts.

    ``with Network() as net: net.add_host("n1")``. ``close`` (idempotent) removes it all,
    also after a setup that failed half way.
    """

    def __init__(self, tag: str | None = None) -> None:
        reason = netns_unavailable_reason()
        if reason is not None:
            raise NetnsUnavailable(reason)
        self.tag = tag or secrets.token_hex(3)
        if re.fullmatch(r"[0-9a-z]{6}", self.tag) is None:
            # one length: a shorter tag would be a prefix of another run's link names
            raise ValueError(f"a tag is 6 lowercase letters or digits, not {self.tag!r}")
        self.bridge = f"{PREFIX}{self.tag}b"
        self.hosts: dict[str, Host] = {}
        self._faults: set[tuple[str, str]] = set()
        self._closed = False
        try:
            with _records_locked():
                cleanup_leftovers()
                self.subnet = self._pick_subnet()
                (RECORDS / f"{self.tag}.json").write_text(json.dumps({
                    "pid": os.getpid(), "start_time": _start_time(os.getpid()),
                    "subnet": str(self.subnet),
                }))  # fmt: skip
                self.control_address = str(self.subnet.network_address + 1)
                ip("link", "add", self.bridge, "type", "bridge")
                ip("addr", "add", f"{self.control_address}/24", "dev", self.bridge)
                ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        taken = _taken_subnets()
        candidates = [
            ipaddress.IPv4Network(f"10.{second}.{third}.0/24")
            for second in SECOND_OCTETS
            for third in range(256)
        ]
        free = [subnet for subnet in candidates if subnet not in taken]
        if not free:
            raise NetnsUnavailable("no free /24 left in 10.100-250.x.0/24")
        return random.choice(free)

    def namespace_of(self, name: str) -> str:
        return f"{PREFIX}-{self.tag}-{name}"

    def add_host(self, name: str) -> Host:
        """A namespace with ``lo`` up and ``eth0`` on the bridge at the next address."""
        if self._closed:
            raise RuntimeError("the network is closed")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        index = len(self.hosts) + 2  # .1 is the bridge's
        if index > 254:
            raise ValueError("a network holds at most 253 hosts")
        host = Host(name, self.namespace_of(name), str(self.subnet.network_address + index))
        veth = f"{PREFIX}{self.tag}v{index}"
        try:
            ip("netns", "add", host.namespace)
            self.hosts[name] = host
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0",
               "netns", host.namespace)  # fmt: skip
            ip("link", "set", veth, "master", self.bridge, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return host

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run in ``host``'s namespace. ``ip netns exec`` execs the program, so
        the pid of the process started is the program's own and signals reach it."""
        return [_ip_binary() or "ip", "netns", "exec", self.hosts[host].namespace, *argv]

    # --- faults ----------------------------------------------------------------------

    def drop(self, src: str, dst: str) -> None:
        """Lose every packet ``src`` sends to ``dst`` (one direction)."""
        if src == dst:
            raise ValueError("a host cannot be cut from itself")
        if (src, dst) in self._faults:
            return
        target = self.hosts[dst].address
        ip("-n", self.hosts[src].namespace, "route", "add", "blackhole", f"{target}/32")
        self._faults.add((src, dst))

    def cut(self, a: str, b: str) -> None:
        """Lose every packet between ``a`` and ``b``, both ways."""
        self.drop(a, b)
        self.drop(b, a)

    def isolate(self, host: str, others: Iterable[str] | None = None) -> None:
        """Cut ``host`` from ``others`` (by default every other host)."""
        for other in self.hosts if others is None else others:
            if other != host:
                self.cut(host, other)

    def heal(self) -> None:
        """Remove every fault route of every host."""
        for src, dst in sorted(self._faults):
            ip("-n", self.hosts[src].namespace, "route", "del", "blackhole",
               f"{self.hosts[dst].address}/32", check=False)  # fmt: skip
        self._faults.clear()

    def faults(self) -> list[tuple[str, str]]:
        """The directions cut now, as ``(src, dst)``: for a run's report."""
        return sorted(self._faults)

    def scratch_dir(self, purpose: str) -> Path:
        """A directory in the system's temporary directory, named after the run (so a
        later run removes it if this one is killed) and removed at ``close``: for what
        must live where another user can reach it, such as PostgreSQL's data."""
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{self.tag}-{purpose}-"))

    # --- teardown --------------------------------------------------------------------

    def close(self) -> None:
        """Kill whatever still runs in the namespaces, delete them, the veths and the
        bridge, and the run's scratch directories and record. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._faults.clear()
        for host in self.hosts.values():
            kill_namespace(host.namespace)
            ip("netns", "del", host.namespace, check=False)
        _remove_run(self.tag)  # also what a failed step made but did not note

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
