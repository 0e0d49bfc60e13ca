"""TLS end to end: a coordinator and two storage nodes serving HTTPS with a test CA's
certificates, authentication on. The SDK reaches them with the CA bundle (argument or
``EOS_CA_FILE``) and a token; the services call each other over HTTPS (partition creation,
KIP-890 verification, markers, ACL fetches), so a transaction that commits and reads back
proves every hop; without the CA bundle, or over plain HTTP, nothing gets through."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sdk import AdminClient, Consumer, NetworkError, RetryConfig, TransactionalProducer
from sdk._errors import EosTimeoutError
from tests.support.cluster import ClusterFactory

pytestmark = pytest.mark.slow


@dataclass
class TlsCluster:
    url: str
    ca_file: str
    token: str


@pytest.fixture(scope="module")
def tls_cluster(module_cluster_factory: ClusterFactory) -> TlsCluster:
    c = module_cluster_factory(database="postgres", auth=True, tls=True)
    assert c.ca_file is not None
    return TlsCluster(c.url, c.ca_file, c.tokens["admin"])


def test_a_transaction_commits_and_reads_back_over_https(tls_cluster: TlsCluster) -> None:
    url, ca, token = tls_cluster.url, tls_cluster.ca_file, tls_cluster.token
    assert url.startswith("https://")
    with AdminClient(url, token=token, ca_file=ca) as admin:
        admin.create_topic("secure", partitions=2)
    producer = TransactionalProducer(url, "secure-tx", token=token, ca_file=ca)
    try:
        producer.init_transactions()
        with producer.transaction():
            for i in range(20):
                producer.send("secure", f"v{i}", key=f"k{i}")
        producer.begin_transaction()
        producer.send("secure", "aborted", key="k0")
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()
    seen: list[str] = []
    with Consumer(url, token=token, ca_file=ca) as consumer:
        consumer.assign([("secure", 0), ("secure", 1)])
        for _ in range(50):
            seen += [r.value for r in consumer.poll(timeout=0.5)]
            if len(seen) >= 20:
                break
    assert sorted(seen) == sorted(f"v{i}" for i in range(20))


def test_the_ca_bundle_may_come_from_the_environment(
    tls_cluster: TlsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOS_CA_FILE", tls_cluster.ca_file)
    monkeypatch.setenv("EOS_TOKEN", tls_cluster.token)
    with AdminClient(tls_cluster.url) as admin:
        assert admin.describe_cluster().nodes


def test_without_the_ca_bundle_or_over_plain_http_nothing_gets_through(
    tls_cluster: TlsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EOS_CA_FILE", raising=False)
    quick = RetryConfig(backoff_ms=10, backoff_max_ms=50, request_timeout_ms=2_000)
    with (
        AdminClient(tls_cluster.url, token=tls_cluster.token, retry=quick) as admin,
        pytest.raises((NetworkError, EosTimeoutError)),
    ):
        admin.describe_cluster(timeout=3.0)
    plain = tls_cluster.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz", timeout=5)


def test_https_with_the_ca_but_no_token_is_refused(tls_cluster: TlsCluster) -> None:
    trust = ssl.create_default_context(cafile=tls_cluster.ca_file)
    answer = httpx.get(f"{tls_cluster.url}/v1/metadata", verify=trust)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "UNAUTHENTICATED"


def test_the_ca_file_argument_is_required_to_be_readable(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        AdminClient("https://127.0.0.1:1", ca_file=str(tmp_path / "missing.pem"))
