"""Structured logs shared by every EOS process: one JSON object per line.

Operators grep and ship these lines; a line about a transaction carries its
``transactional_id``, ``producer_id`` and ``producer_epoch`` as fields (pass them with
``extra=txn_fields(...)``), so one query follows a transaction across coordinators and
storage nodes. ``--log-format text`` gives plain lines for a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

# Attributes every LogRecord has; anything else on a record came in through ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def txn_fields(
    transactional_id: str | None = None,
    producer_id: int | None = None,
    producer_epoch: int | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``extra=`` of a log call about a transaction (None values are left out)."""
    fields = {
        "transactional_id": transactional_id,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        **more,
    }
    return {k: v for k, v in fields.items() if v is not None}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                body[key] = value
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    """Route the root logger (uvicorn's included) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


UVICORN_LOG_CONFIG: dict[str, Any] = {"version": 1, "disable_existing_loggers": False}
"""Passed to uvicorn so it keeps the handlers ``configure_logging`` installed."""
