"""The one cluster fixture of the tests: storage nodes and coordinator processes started by
the product's launcher (``eos_cli.launcher``), described by a ``ClusterSpec``.

Every test package used to start its clusters its own way; what differed is now a field
of the spec:

* ``nodes``, ``coordinators``: how many of each (several coordinators share PostgreSQL).
* ``database``: ``"sqlite"`` (the coordinator's data directory), ``"postgres"`` (a
  throw-away database on the shared server, dropped afterwards) or a SQLAlchemy URL.
* ``auth``: authentication on, a token per role of ``PRINCIPALS``, ``User:admin`` a super
  user; ``tls``: every service on HTTPS with a certificate of a test CA.
* ``entry``: the one coordinator the nodes verify with and the clients start from (by
  default each node is given every coordinator, node N starting at the N-th).
* ``proxied_node``: fault proxies (``tests.support.proxy``) in front of that node and of
  the first coordinator, for the chaos runs.
* ``lease_ms``: the coordinators' lease on their transaction-log partitions;
  ``coordinator_timeout_ms``: how long a node waits on a coordinator before the next one;
  ``fast_loops``: the coordinators retry markers and reconcile partitions within a fraction
  of a second (``FAST_LOOPS``), else at the production pace.
* ``fsync``, ``group_offset_partitions``, ``log_level``, and extra flags for each kind.

Fixtures (``tests/conftest.py``): ``cluster_factory`` makes clusters that live for one
test, ``session_cluster_factory`` clusters that live for the session (per xdist worker);
its ``shared(spec)`` hands every package asking for the same spec the same cluster.
``start=False`` fixes the ports and starts nothing, for tests that start the services
one by one. The ports are fixed when a cluster is made, so a service killed and started
again comes back at the same address, as a restarted server would.
"""

from __future__ import annotations

import contextlib
import ssl
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import trustme

from eos_cli.launcher import ClusterPlan, LocalCluster, ServiceProcess, TlsFiles, describe_exit
from eos_security.tokens import new_token, token_entry
from tests.support.coordinators import temp_database
from tests.support.nodes import INTERNAL_TOKEN
from tests.support.proxy import FaultProxy

PRINCIPALS = ("admin", "etl", "reader", "writer", "outsider")
ACL_REFRESH_MS = 400
# Background loops of test coordinators run fast, so that a test polls for seconds, not
# for the production defaults' minutes.
#: How long a test cluster's service may take to become ready.
START_TIMEOUT_S = 120
FAST_LOOPS = ("--marker-backoff-max-ms", "200", "--reconcile-interval-ms", "100")


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 2
    coordinators: int = 1
    database: str = "sqlite"
    auth: bool = False
    tls: bool = False
    fsync: bool = False
    entry: int | None = None
    proxied_node: int | None = None
    lease_ms: int | None = None
    coordinator_timeout_ms: int | None = None
    fast_loops: bool = True
    group_offset_partitions: int = 5
    log_level: str = "warning"
    node_flags: tuple[str, ...] = ()
    coordinator_flags: tuple[str, ...] = ()
    replication_factor: int | None = None  # the coordinators' default (None: 1)


class Cluster(LocalCluster):
    """A test cluster: the launcher's services, plus what the tests reach for (clients
    with a role's token, topics with fresh names, the coordinators in rotation)."""

    def __init__(self, root: Path, spec: ClusterSpec, database_url: str | None) -> None:
        self.root = root
        self.spec = spec
        self.database_url = database_url
        root.mkdir(parents=True, exist_ok=True)
        self.tokens: dict[str, str] = {}
        self.extra_tokens: list[str] = []
        self.tokens_file = root / "tokens.toml"
        if spec.auth:
            self.tokens = {role: new_token() for role in PRINCIPALS}
            self.tokens_file.write_text(
                "".join(token_entry(f"User:{r}", t) for r, t in self.tokens.items())
            )
        tls = _test_ca(root) if spec.tls else None
        self.ca_file = str(tls.ca) if tls else None
        node_flags = [*spec.node_flags]
        coordinator_flags = [*FAST_LOOPS] if spec.fast_loops else []
        if spec.coordinator_timeout_ms is not None:
            node_flags = ["--coordinator-timeout-ms", str(spec.coordinator_timeout_ms), *node_flags]
        if spec.lease_ms is not None:
            coordinator_flags += ["--lease-ms", str(spec.lease_ms)]
        plan = ClusterPlan(
            data_dir=root, nodes=spec.nodes, coordinators=spec.coordinators, port_base=None,
            database_url=database_url, log_level=spec.log_level, token=INTERNAL_TOKEN,
            auth=spec.auth, auth_tokens_file=self.tokens_file if spec.auth else None,
            acl_refresh_ms=ACL_REFRESH_MS if spec.auth else None, tls=tls, fsync=spec.fsync,
            group_offset_partitions=spec.group_offset_partitions, node_flags=node_flags,
            coordinator_flags=[*coordinator_flags, *spec.coordinator_flags], own_session=False,
            default_replication_factor=spec.replication_factor,
        )  # fmt: skip
        self._stopped = False
        self.node_proxy: FaultProxy | None = None
        self.coordinator_proxy: FaultProxy | None = None
        self._plan = plan
        verify = {n: self.coordinator_list(n - 1) for n in plan.node_ports}
        if spec.proxied_node is not None:
            self.node_proxy = FaultProxy(plan.node_ports[spec.proxied_node], seed=1)
            self.coordinator_proxy = FaultProxy(plan.coordinator_ports[0], seed=2)
            plan.node_addresses = {spec.proxied_node: self.node_proxy.url}
            verify[spec.proxied_node] = self.coordinator_proxy.url
        plan.verify_with = verify
        # a start runs the migrations and meets the other services: on a machine loaded by
        # the whole suite (images being built, JVMs starting) a minute was seen to fall short
        super().__init__(plan, start_timeout=START_TIMEOUT_S)

    @property
    def coordinator(self) -> ServiceProcess:
        return self.coordinators[0]

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    def coordinator_url(self, index: int) -> str:
        urls = self._plan.coordinator_urls
        return urls[index % len(urls)]

    def coordinator_list(self, index: int = 0) -> str:
        """Every coordinator, comma-separated, starting at the ``index``-th (or only the
        entry coordinator, when the spec names one)."""
        if self.spec.entry is not None:
            return self.coordinator_url(self.spec.entry)
        count = len(self._plan.coordinator_urls)
        return ",".join(self.coordinator_url(index + i) for i in range(count))

    def every_coordinator(self) -> str:
        """Every coordinator, comma-separated, whatever the entry: a full bootstrap list."""
        return ",".join(self._plan.coordinator_urls)

    def bootstrap(self, index: int = 0) -> str:
        """What a client starts from; spread clients over the coordinators by index."""
        return self.coordinator_list(index)

    def start(self) -> Cluster:
        self._stopped = False
        for proxy in (self.node_proxy, self.coordinator_proxy):
            if proxy is not None:
                proxy.start()
        try:
            super().start()
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, n: int) -> ServiceProcess:
        """Start node ``n`` (again: same port, same data) and wait until it is ready."""
        return self.node(n).start(self.start_timeout)

    def start_coordinator(self, index: int) -> ServiceProcess:
        """Start coordinator ``index`` (again, as a new instance: an instance id names one
        process's life) and wait until it is ready."""
        return self.coordinators[index].start(self.start_timeout)

    def restart_coordinator(self, index: int) -> None:
        self.start_coordinator(index)

    def stop(self) -> None:
        """Stop every service, after noting in ``logs/exits.txt`` each one that had exited
        already and how: a service a failed test found gone (connections refused, a
        restart that never got ready) says there whether it was killed, and by which
        signal, or exited by itself, which its log alone cannot say after a SIGKILL."""
        gone = [
            f"{service.name}: {describe_exit(code)} before the teardown\n"
            for service in self.services
            if service.process is not None and (code := service.process.poll()) is not None
        ]
        if gone and not self._stopped:  # a second stop (the factory's) finds all gone
            exits = self.root / "logs" / "exits.txt"
            exits.parent.mkdir(parents=True, exist_ok=True)
            exits.write_text("".join(gone))
        self._stopped = True
        super().stop()
        for proxy in (self.node_proxy, self.coordinator_proxy):
            if proxy is not None:
                proxy.stop()

    def client(self, role: str | None, base_url: str | None = None) -> httpx.Client:
        """A client presenting ``role``'s token (``None``: no token; ``"internal"``: the
        internal token; ``"bogus"``: a token nobody has)."""
        headers = {}
        if role == "internal":
            headers["authorization"] = f"Bearer {INTERNAL_TOKEN}"
        elif role == "bogus":
            headers["authorization"] = "Bearer eos_not-a-real-token"
        elif role is not None:
            headers["authorization"] = f"Bearer {self.tokens[role]}"
        return httpx.Client(
            base_url=base_url or self.url, headers=headers, timeout=30, verify=self.verify
        )

    def add_token(self, principal: str) -> str:
        """A new token for ``principal``, appended to the tokens file the services reload."""
        token = new_token()
        with self.tokens_file.open("a") as out:
            out.write(token_entry(principal, token))
        self.extra_tokens.append(token)
        return token

    def partition_count(self) -> int:
        """The partitions of every topic, the internal ones included."""
        with self.client("admin" if self.spec.auth else None) as client:
            answer = client.get("/v1/metadata")
            answer.raise_for_status()
        return sum(len(topic["partitions"]) for topic in answer.json()["topics"])

    def create_topic(self, partitions: int = 2, prefix: str = "t") -> str:
        """A topic with a fresh name, so tests sharing a cluster never meet."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        with self.client("admin" if self.spec.auth else None) as client:
            client.post("/v1/topics", json={"name": name, "partitions": partitions}
                        ).raise_for_status()  # fmt: skip
        return name


def _test_ca(root: Path) -> TlsFiles:
    """A test CA and a certificate for 127.0.0.1 it signed."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(cert=root / "cert.pem", key=root / "key.pem", ca=root / "ca.pem")
    files.cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(files.key))
    ca.cert_pem.write_to_path(str(files.ca))
    return files


class ClusterFactory:
    """``factory(nodes=3, database="postgres")``: a started cluster under ``root``.
    Every cluster made is stopped, and every throw-away database dropped, at ``close``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: list[Cluster] = []
        self._shared: dict[ClusterSpec, Cluster] = {}
        self._databases = contextlib.ExitStack()

    def __call__(
        self, spec: ClusterSpec | None = None, *, start: bool = True, **fields: Any
    ) -> Cluster:
        spec = replace(spec or ClusterSpec(), **fields)
        cluster = Cluster(
            self.root / f"cluster-{len(self._made) + 1}", spec, self._database(spec.database)
        )
        self._made.append(cluster)
        return cluster.start() if start else cluster

    def shared(
        self, spec: ClusterSpec | None = None, *, recycle_above: int | None = None, **fields: Any
    ) -> Cluster:
        """The started cluster of this spec, made on first use: the SDK, Spark and OpenAPI
        tests all run against one cluster per session (per worker).

        With ``recycle_above``, one that holds more partitions than that is stopped and a
        new one made. Every replica of every partition polls its leader and is in every
        heartbeat answer, idle or not: a three-node cluster with 200 replicated partitions
        burns about 60% of a core doing nothing, and tests that give each case topics of
        its own pile them up. Ask only where nothing still holds the old cluster (a module
        starting, in a lane whose modules run one after the other)."""
        spec = replace(spec or ClusterSpec(), **fields)
        held = self._shared.get(spec)
        if (
            held is not None
            and recycle_above is not None
            and held.partition_count() > recycle_above
        ):
            held.stop()
            del self._shared[spec]
        if spec not in self._shared:
            self._shared[spec] = self(spec)
        return self._shared[spec]

    def _database(self, database: str) -> str | None:
        if database == "sqlite":
            return None
        if database == "postgres":
            return self._databases.enter_context(temp_database())
        return database

    def close(self) -> None:
        try:
            for cluster in reversed(self._made):
                cluster.stop()
        finally:
            self._databases.close()

    def __enter__(self) -> ClusterFactory:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
