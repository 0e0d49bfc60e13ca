"""The Jepsen run's test bed works: hosts in network namespaces, blackhole-route faults
between them, and the services on those hosts.

A fault that silently does nothing makes every later Jepsen run pass for nothing, so each
one is checked from where it matters: a coordinator cut from a node cannot reach it while
a client still can, a skewed coordinator's own HTTP answers carry the skewed time, and a
run leaves no namespace, link or process behind, also when it was killed.
"""

from __future__ import annotations

import email.utils
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.jepsen.conftest import HostClusterFactory
from tests.jepsen.hosts import PORT, HostCluster, HostSpec
from tests.jepsen.netns import RECORDS, Network, cleanup_leftovers, ip, namespace_pids
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("jepsen"), pytest.mark.timeout(240)]

#: Tries a TCP connection to ``argv[1]``:``argv[2]`` for 1.5 s; prints ``ok`` or ``fail``.
CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
        print("ok")
    except OSError as error:
        print("fail", error)
""")

#: Produces one record to ``argv[2]`` partition 1 and reads it back (read_committed).
PRODUCE_CONSUME = textwrap.dedent("""
    import sys, time
    from sdk import Consumer, Producer
    bootstrap, topic, value = sys.argv[1:4]
    with Producer(bootstrap) as producer:
        offset = producer.send(topic, value, partition=1).result(timeout=60).offset
    with Consumer(bootstrap) as consumer:
        consumer.assign([(topic, 1)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            values = [r.value for r in consumer.poll(timeout=1.0)]
            if value in values:
                print("read", offset)
                break
        else:
            sys.exit("not read back")
""")


def _run_in(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


def _connects(net: Network, src: str, dst: str, port: int) -> bool:
    """Whether host ``src`` opens a TCP connection to host ``dst`` within 1.5 s."""
    address = net.hosts[dst].address
    out = _run_in(net.argv(src, [sys.executable, "-c", CONNECT, address, str(port)]))
    return out == "ok"


def _date_offset(url: str) -> float:
    """How far the ``Date`` header of ``url``'s answer is from this process's clock."""
    answer = httpx.get(url + "/readyz", timeout=5.0)
    date = email.utils.parsedate_to_datetime(answer.headers["date"])
    return date.timestamp() - time.time()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _leftovers(tag: str) -> list[str]:
    namespaces = [n for n in ip("netns", "list").split() if n.startswith(f"eosj-{tag}-")]
    links = [line for line in ip("-br", "link").splitlines() if f"eosj{tag}" in line]
    return namespaces + links


def test_cluster_serves_clients_and_obeys_faults(host_cluster_factory: HostClusterFactory) -> None:
    cluster = host_cluster_factory(HostSpec())
    net = cluster.net
    assert set(cluster.hosts) == {"pg", "c1", "c2", "c3", "n1", "n2", "n3", "cl1", "cl2", "cl3"}
    postmaster = cluster.services["pg"].pid
    assert postmaster is not None
    assert Path(f"/proc/{postmaster}/exe").resolve().name == "postgres"  # not setpriv's
    pids = [pid for host in cluster.hosts.values() for pid in namespace_pids(host.namespace)]

    # a topic made over HTTP, a record produced and read back from a client host
    topic = f"hosts-{uuid.uuid4().hex[:8]}"
    created = httpx.post(
        cluster.coordinator_urls[0] + "/v1/topics",
        json={"name": topic, "partitions": 3, "replication_factor": 3}, timeout=60,
    )  # fmt: skip
    assert created.status_code < 300, created.text
    script = [sys.executable, "-c", PRODUCE_CONSUME, cluster.bootstrap, topic, "v-1"]
    out = _run_in(cluster.client_argv("cl1", script), env=cluster.client_env(), timeout=120)
    assert out.startswith("read"), out
    assert cluster.leader_of(topic, 1) in cluster.node_urls

    # a cut is both ways and touches neither other hosts nor the test's own view
    assert _connects(net, "c1", "n1", PORT)
    net.cut("n1", "c1")
    assert net.faults() == [("c1", "n1"), ("n1", "c1")]
    assert not _connects(net, "c1", "n1", PORT)
    assert not _connects(net, "n1", "c1", PORT)
    assert _connects(net, "cl1", "n1", PORT)
    assert _connects(net, "c2", "n1", PORT)
    assert httpx.get(cluster.url("n1") + "/readyz", timeout=5.0).status_code == 200
    net.heal()
    assert net.faults() == []
    assert _connects(net, "c1", "n1", PORT)
    assert _connects(net, "n1", "c1", PORT)
    net.drop("cl2", "n2")  # one direction only: n2 may still send to cl2's address
    assert not _connects(net, "cl2", "n2", PORT)
    net.heal()

    # pause and resume
    node = cluster.services["n3"].pid
    assert node is not None
    cluster.pause("n3")
    wait_until(lambda: _state(node) == "T", timeout=5, what="n3 stopped")
    cluster.resume("n3")
    wait_until(lambda: _state(node) != "T", timeout=5, what="n3 running")

    # PostgreSQL killed (its postmaster: the pid held is the server's) and started again
    cluster.kill("pg")
    assert not Path(f"/proc/{postmaster}").exists()
    cluster.restart("pg")
    assert cluster.services["pg"].pid != postmaster and cluster.services["pg"].alive()
    pids += namespace_pids(net.hosts["pg"].namespace)

    # c2 restarted 300 s ahead: its own answers say so, its monotonic clock is true, and
    # it keeps running (its time.sleep works under libfaketime); c1's clock is untouched
    cluster.restart("c2", clock_offset_s=300.0)
    pids += namespace_pids(net.hosts["c2"].namespace)
    assert abs(_date_offset(cluster.url("c2")) - 300) < 10
    assert abs(_date_offset(cluster.url("c1"))) < 10
    probe = "import time; print(time.time(), time.monotonic())"
    wall, mono = map(float, _run_in(net.argv("c2", [sys.executable, "-c", probe]),
                                    env=cluster.environment("c2")).split())  # fmt: skip
    assert abs(wall - time.time() - 300) < 10 and abs(mono - time.monotonic()) < 10
    time.sleep(2.5)  # the parent watch sleeps a second at a time
    assert cluster.services["c2"].alive()
    assert "Invalid argument" not in cluster.services["c2"].tail(200)

    # nothing of the run is left once it is stopped
    cluster.stop()
    assert _leftovers(net.tag) == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), pids
    assert not (RECORDS / f"{net.tag}.json").exists()
    assert cluster.pg_dir is not None and not cluster.pg_dir.exists()


def test_a_half_built_network_is_removed() -> None:
    """A step failing half way (here a namespace that exists already) removes the rest."""
    net = Network()
    net.add_host("a")
    ip("netns", "add", net.namespace_of("b"))
    try:
        with pytest.raises(RuntimeError, match="netns add"):
            net.add_host("b")
        assert _leftovers(net.tag) == []
        net.close()  # again: nothing to do
    finally:
        ip("netns", "del", net.namespace_of("b"), check=False)


def test_leftovers_of_a_killed_run_are_removed(tmp_path: Path) -> None:
    """A run SIGKILLed with a process in its namespace: the next ``Network`` finds its
    owner dead and removes its namespace, process, links and record."""
    script = textwrap.dedent("""
        import subprocess, sys, time
        from tests.jepsen.netns import Network
        net = Network()
        net.add_host("a")
        child = subprocess.Popen(net.argv("a", ["sleep", "300"]), start_new_session=True)
        print(net.tag, child.pid, flush=True)
        time.sleep(300)
    """)
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert owner.stdout is not None
    with owner.stdout:
        tag, child = owner.stdout.readline().split()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert _leftovers(tag) != []
    cleanup_leftovers()  # (a run beside this one may have been first to do it)
    assert _leftovers(tag) == []
    wait_until(lambda: not Path(f"/proc/{child}").exists() or _state(int(child)) == "Z",
               timeout=5, what="the orphan killed")  # fmt: skip


def test_stop_is_safe_on_a_cluster_never_started(tmp_path: Path) -> None:
    cluster = HostCluster(tmp_path / "never")
    cluster.stop()
    cluster.stop()
