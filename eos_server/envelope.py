"""Every error leaves a service in the envelope of docs/design.md §4.

Whether the error came from the contract, from schema validation (422), from an unknown
path or from a bug (500, logged with its traceback, never shown), a client sees the same
``{"error": {"code", "message", "retriable"}}`` body, so one parser serves every answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from eos_protocol.common import ErrorEnvelope
from eos_protocol.errors import (
    CATALOGUE,
    EosError,
    InternalError,
    MessageTooLargeError,
    NotFoundError,
    UnauthenticatedError,
)

log = logging.getLogger("eos.http")


def error_response(error: EosError) -> JSONResponse:
    response = JSONResponse(status_code=error.http_status, content=error.envelope())
    if isinstance(error, UnauthenticatedError):
        response.headers["www-authenticate"] = 'Bearer realm="eos"'  # RFC 6750's challenge
    return response


def _envelope(status: int, code: str, message: str, details: Any = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message, "retriable": False}
    if details is not None:
        body["details"] = details
    return JSONResponse(status_code=status, content={"error": body})


def install_error_handlers(app: FastAPI, on_error: Callable[[str], None] | None = None) -> None:
    """Route every failure of ``app`` into the error envelope; ``on_error`` is told the
    code of each contract error answered (for a metric)."""

    async def on_eos_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EosError)
        if on_error is not None:
            on_error(exc.code)
        return error_response(exc)

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        message = f"{'.'.join(first['loc'])}: {first['msg']}"
        return _envelope(422, "INVALID_REQUEST", message, {"problems": problems})

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return error_response(NotFoundError(str(exc.detail)))
        if exc.status_code == 413:
            return error_response(MessageTooLargeError(str(exc.detail)))
        if exc.status_code == 401:
            return error_response(UnauthenticatedError(str(exc.detail)))
        return _envelope(exc.status_code, "INVALID_REQUEST", str(exc.detail))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(InternalError("unexpected server error; see the service log"))

    app.add_exception_handler(EosError, on_eos_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def error_responses(*codes: str, validated: bool = True) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for an operation that may answer with these codes.

    Each status gets the error envelope as its schema, the codes it may carry in its
    description and one example per code. 400 ``INVALID_REQUEST`` is always listed
    (``RequestShape`` may refuse any request before it reaches a route), and so is schema
    validation (422 ``INVALID_REQUEST``) unless ``validated`` is false: an operation with
    no parameter and no body (``/healthz``, ``/metrics``) has nothing to validate, and
    listing a 422 it can never answer would mislead a client's error handling.
    """
    # 400: any request may be refused by ``RequestShape`` (non-UTF-8 escapes, huge headers)
    by_status: dict[int, list[str]] = {400: ["INVALID_REQUEST"]}
    if validated:
        by_status[422] = ["INVALID_REQUEST"]
    for code in codes:
        status = CATALOGUE[code].http_status
        found = by_status.setdefault(status, [])
        if code not in found:
            found.append(code)
    return {
        status: {
            "model": ErrorEnvelope,
            "description": (
                ("Schema validation failed. " if status == 422 else "")
                + "Error envelope; code is one of: "
                + ", ".join(sorted(found))
            ),
            "content": {
                "application/json": {
                    "examples": {
                        code: {
                            "summary": CATALOGUE[code].description,
                            "value": {
                                "error": {
                                    "code": code,
                                    "message": CATALOGUE[code].description,
                                    "retriable": CATALOGUE[code].retriable,
                                }
                            },
                        }
                        for code in sorted(found)
                    }
                }
            },
        }
        for status, found in sorted(by_status.items())
    }
