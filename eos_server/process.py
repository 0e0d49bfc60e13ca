"""Running a service process: settings checked before it listens, then uvicorn with the
product's structured logs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from pydantic import ValidationError

from eos_server.logs import UVICORN_LOG_CONFIG, configure_logging
from eos_server.parent_watch import watch_parent

log = logging.getLogger("eos.http")

SettingsT = TypeVar("SettingsT")


def settings_or_exit(model: Callable[..., SettingsT], **values: Any) -> SettingsT:
    """The service's settings, or a clear message and exit status 2.

    A setting the service could not use (a malformed URL, a short internal token) stops
    it before it listens, with one line per problem naming the flag or ``EOS_*``
    variable, instead of a traceback, or a service that starts and fails every request.
    """
    try:
        return model(**values)
    except ValidationError as exc:
        lines = []
        for problem in exc.errors():
            name = ".".join(str(p) for p in problem["loc"]) or "settings"
            flag = "--" + name.replace("_", "-")
            message = str(problem["msg"]).removeprefix("Value error, ")
            lines.append(f"error: {flag} (EOS_{name.upper()}): {message}")
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


def serve(
    service: str,
    make_app: Callable[[], FastAPI],
    *,
    host: str,
    port: int,
    log_level: str,
    log_format: str,
    graceful_shutdown_s: int,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> None:
    """Run a service in the foreground under uvicorn, with the product's structured logs.

    Logging is configured before the app is built, so start-up lines are structured too;
    uvicorn's access log stays off (one line per request costs more than a produce, and
    an access log is where a token in a query string would end up). With ``tls_cert`` and
    ``tls_key`` the service speaks HTTPS only. Started by a supervisor, it stops when
    the supervisor is gone (``parent_watch``).
    """
    import uvicorn

    configure_logging(service, log_level, log_format)
    try:
        app = make_app()
    except ValueError as exc:  # a bad setting found while building (a tokens file, say)
        log.error("%s cannot start: %s", service, exc)
        raise SystemExit(2) from None
    watch_parent(service)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        log_config=UVICORN_LOG_CONFIG,
        access_log=False,
        # No X-Forwarded-* rewriting: nothing reads the client's address, and the layer
        # parses headers on every request of the hot paths.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=graceful_shutdown_s,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
    )
