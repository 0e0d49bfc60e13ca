"""``eos-healthcheck``, the images' HEALTHCHECK: 0 only for a 2xx answer, 1 with one line
saying why for an error status, a closed port or a server that never answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eos_server.healthcheck import default_url, main


class _Service(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the name http.server calls
        self.send_response(200 if self.path == "/readyz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_ready_is_0_and_anything_else_is_1_with_a_reason(
    service: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOS_PORT", str(service))
    monkeypatch.delenv("EOS_TLS_CERT", raising=False)
    assert main([]) == 0
    assert capsys.readouterr().out.strip() == f"http://127.0.0.1:{service}/readyz ok"

    assert main(["--url", f"http://127.0.0.1:{service}/json/"]) == 1
    assert capsys.readouterr().err.strip() == f"http://127.0.0.1:{service}/json/ answered 503"

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    assert main(["--url", f"http://127.0.0.1:{closed}/readyz"]) == 1
    assert "did not answer" in capsys.readouterr().err


def test_a_server_that_never_answers_fails_within_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts the connection, never answers
        port = silent.getsockname()[1]
        assert main(["--url", f"http://127.0.0.1:{port}/readyz", "--timeout", "0.3"]) == 1
    assert "did not answer" in capsys.readouterr().err


@pytest.mark.unit
def test_the_default_address_follows_the_service_settings() -> None:
    assert default_url({}) == "http://127.0.0.1:8080/readyz"
    assert default_url({"EOS_PORT": "9092"}) == "http://127.0.0.1:9092/readyz"
    assert default_url({"EOS_PORT": "9092", "EOS_TLS_CERT": "/c.pem"}) == (
        "https://127.0.0.1:9092/readyz"
    )
