"""The SDK's clients share one TLS context per CA bundle (``sdk._tls.tls_context``):
loading a bundle costs tens of milliseconds of CPU, which short-lived clients (a Spark
task, a micro-batch's commit, a CLI call) used to pay every time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trustme

from sdk._tls import tls_context

pytestmark = pytest.mark.unit


def test_the_default_bundle_is_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    assert tls_context(None) is tls_context(None)
    assert tls_context(None).get_ca_certs() or tls_context(None).cert_store_stats()["x509_ca"]


def test_a_ca_file_gets_its_own_context_loaded_again_when_it_changes(tmp_path: Path) -> None:
    first, second = trustme.CA(), trustme.CA()
    bundle = tmp_path / "ca.pem"
    first.cert_pem.write_to_path(str(bundle))
    context = tls_context(str(bundle))
    assert context is tls_context(str(bundle))
    assert context is not tls_context(None)
    serials = [c["serialNumber"] for c in context.get_ca_certs()]
    assert len(serials) == 1
    second.cert_pem.write_to_path(str(bundle))  # the CA rotated
    os.utime(bundle, (1, 1))  # a different mtime, whatever the clock's resolution
    rotated = tls_context(str(bundle))
    assert rotated is not context
    assert [c["serialNumber"] for c in rotated.get_ca_certs()] != serials
