"""A cluster with authentication on: a coordinator on its own PostgreSQL database and two
storage nodes, all reading one tokens file, with a principal per role of the tests; with
``tls=True`` every service serves HTTPS with a certificate of a test CA."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trustme

from eos_security.tokens import new_token, token_entry
from tests.support.coordinators import CoordinatorProcess, temp_database
from tests.support.nodes import INTERNAL_TOKEN, NodeProcess
from tests.support.processes import free_port

PRINCIPALS = ("admin", "etl", "reader", "writer", "outsider")
ACL_REFRESH_MS = 400


@dataclass
class SecureCluster:
    coordinator: CoordinatorProcess
    nodes: list[NodeProcess]
    tokens: dict[str, str]  # role -> token
    tokens_file: Path
    ca_file: str | None = None  # the test CA's bundle when the services speak HTTPS
    extra_tokens: list[str] = field(default_factory=list)

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    @property
    def url(self) -> str:
        return self.coordinator.url

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

    def logs(self) -> str:
        return "\n".join(
            p.log_path.read_text(errors="replace") for p in (self.coordinator, *self.nodes)
        )

    def add_token(self, principal: str) -> str:
        token = new_token()
        with self.tokens_file.open("a") as out:
            out.write(token_entry(principal, token))
        self.extra_tokens.append(token)
        return token


def _test_ca(root: Path) -> tuple[list[str], str]:
    """A test CA and a certificate for 127.0.0.1 it signed: the services' TLS flags and
    the CA bundle's path."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca-file", str(ca_file)]
    return flags, str(ca_file)


@contextlib.contextmanager
def secure_cluster(
    root: Path, *, log_level: str = "debug", tls: bool = False
) -> Iterator[SecureCluster]:
    """Authentication on (super user ``User:admin``), and HTTPS everywhere with ``tls``."""
    tokens = {role: new_token() for role in PRINCIPALS}
    tokens_file = root / "tokens.toml"
    root.mkdir(parents=True, exist_ok=True)
    tokens_file.write_text("".join(token_entry(f"User:{r}", t) for r, t in tokens.items()))
    auth = ["--auth-tokens-file", str(tokens_file), "--acl-refresh-ms", str(ACL_REFRESH_MS)]
    ca_file = None
    if tls:
        tls_flags, ca_file = _test_ca(root)
        auth += tls_flags
    scheme = "https" if tls else "http"
    port = free_port()
    nodes = [
        NodeProcess(
            root / f"node-{i}", node_id=i, coordinator_url=f"{scheme}://127.0.0.1:{port}",
            extra=["--no-fsync", "--group-offset-partitions", "5", *auth,
                   "--log-level", log_level],
        )
        for i in (1, 2)
    ]
    verify = ssl.create_default_context(cafile=ca_file) if ca_file else True
    for node in nodes:
        node.scheme, node.verify = scheme, verify
    with temp_database() as database_url:
        coordinator = CoordinatorProcess(
            root, database_url=database_url, port=port,
            nodes=",".join(f"{n.node_id}={n.url}" for n in nodes),
            extra=["--group-offset-partitions", "5", "--super-users", "User:admin",
                   "--reconcile-interval-ms", "100", "--public-url",
                   f"{scheme}://127.0.0.1:{port}", *auth, "--log-level", log_level],
        )
        coordinator.scheme, coordinator.verify = scheme, verify
        try:
            for node in nodes:
                node.start()
            coordinator.start()
            yield SecureCluster(coordinator, nodes, tokens, tokens_file, ca_file)
        finally:
            coordinator.stop()
            for node in nodes:
                node.stop()
