"""Running a service process: settings checked before it listens, then uvicorn with the
product's structured logs."""

from __future__ import annotations

import gc
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


#: Allocations between two young-generation collections (CPython's default is 700).
YOUNG_COLLECTION_EVERY = 10_000


def tune_collector() -> None:
    """Set the cyclic garbage collector for a service that has finished starting.

    Every request allocates a few hundred short-lived objects (the ASGI messages, the
    parsed body, futures), so at CPython's default a young collection ran every few
    requests, and each older one walked everything the start had built (routes, models,
    SQLAlchemy's tables) though none of it is ever garbage. What the start built is
    frozen out of the collector's walks, and young collections run every
    ``YOUNG_COLLECTION_EVERY`` allocations: measured with ``python -m
    eos_bench.suite_scale --instances 1 --flow v2``, 5 to 10% more committed transactions
    per second for 4 to 8% less CPU per transaction. Cycles are still collected, later.
    """
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, old)


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
    tune_collector()
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
