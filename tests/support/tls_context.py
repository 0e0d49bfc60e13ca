"""One default TLS context for the whole test process.

httpx builds a TLS context for every client it makes, even one that only ever speaks
plain HTTP to a loopback port: it loads certifi's CA bundle, 20-40 ms of CPU each time.
The tests make thousands of clients (``httpx.get`` in polling loops, a few SDK clients per
test), and on a two-core machine those loads came to a fifth of the CPU of the whole
suite, slowing every service the tests were waiting on. The default context (verify
against the bundle or the ``SSL_CERT_*`` one, no client certificate) is the same every
time, so the test process builds it once for each such bundle. Every other context (a
test CA's, one given by the code under test) is built as before, and the services, being
other processes, are untouched.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

from httpx._transports import default as transports

_build = transports.create_ssl_context


@functools.cache
def _default_context(trust_env: bool, cafile: str | None, capath: str | None) -> ssl.SSLContext:
    # built under the environment the key was read from: httpx reads SSL_CERT_* itself
    return _build(verify=True, cert=None, trust_env=trust_env)


def _create_ssl_context(
    verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is True and cert is None:
        env = os.environ if trust_env else {}
        return _default_context(trust_env, env.get("SSL_CERT_FILE"), env.get("SSL_CERT_DIR"))
    return _build(verify=verify, cert=cert, trust_env=trust_env)


def install() -> None:
    """Build the default context once from now on (idempotent)."""
    transports.create_ssl_context = _create_ssl_context
