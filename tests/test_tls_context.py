"""The test process builds httpx's default TLS context once (``tests/support/tls_context.py``):
if an httpx upgrade moved what it patches, every client would load a CA bundle again and
the suite would quietly get slower, so this checks it still takes hold, and that a context
given explicitly is still the one used."""

from __future__ import annotations

import ssl

import httpx
import pytest

pytestmark = pytest.mark.unit


def _context(client: httpx.Client) -> ssl.SSLContext:
    pool = client._transport._pool  # type: ignore[attr-defined]
    return pool._ssl_context  # type: ignore[no-any-return]


def test_clients_share_one_default_context() -> None:
    with httpx.Client() as first, httpx.Client() as second:
        assert _context(first) is _context(second)


def test_a_context_given_explicitly_is_used_as_it_is() -> None:
    mine = ssl.create_default_context()
    with httpx.Client(verify=mine) as client, httpx.Client() as default:
        assert _context(client) is mine
        assert _context(default) is not mine
