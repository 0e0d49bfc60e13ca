"""TLS contexts shared by the SDK's clients.

Loading a CA bundle costs 20-40 ms of CPU, and the SDK's clients are often short-lived (a
Spark task, a micro-batch's commit, a CLI call), so a context is built once per process and
bundle and shared by every client; a bundle changed on disk (a rotated CA) is loaded again.
"""

from __future__ import annotations

import functools
import os
import ssl

import httpx


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context that verifies against ``ca_file`` (None: httpx's default, the
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` bundle or certifi's), built once per process and
    bundle and shared by every client. Loading a bundle costs 20-40 ms of CPU, and the
    SDK's clients are often short-lived (a Spark task, a micro-batch's commit, a CLI
    call): a client a call paid that for every time. A bundle changed on disk (a rotated
    CA) is loaded again."""
    if not ca_file:
        env_file = os.environ.get("SSL_CERT_FILE") or None
        env_dir = os.environ.get("SSL_CERT_DIR") or None
        return _default_tls_context(env_file, env_dir, _mtime(env_file), _mtime(env_dir))
    return _tls_context(ca_file, _mtime(ca_file))


def _mtime(path: str | None) -> float | None:
    try:
        return None if path is None else os.stat(path).st_mtime
    except OSError:
        return None  # a missing bundle fails in ``load_verify_locations``, with its name


@functools.lru_cache(maxsize=16)
def _tls_context(ca_file: str, _mtime: float | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


@functools.lru_cache(maxsize=4)
def _default_tls_context(
    _env_file: str | None, _env_dir: str | None, _file_mtime: float | None,
    _dir_mtime: float | None,
) -> ssl.SSLContext:
    """httpx's own default (it reads ``SSL_CERT_*`` itself), once per environment."""
    return httpx.create_ssl_context()
