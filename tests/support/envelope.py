"""The contract's rule for every answer, as a checker the bad-input tests share."""

from __future__ import annotations

import httpx

from eos_protocol.errors import CATALOGUE


def envelope_problems(status: int, body: bytes) -> list[str]:
    """What is wrong with an answer by the contract's rules (empty: nothing)."""
    if status < 400:
        return []
    try:
        error = httpx.Response(status, content=body).json()["error"]
        code, retriable, message = error["code"], error["retriable"], error["message"]
    except (ValueError, KeyError, TypeError):
        return [f"HTTP {status} without the error envelope: {body[:200]!r}"]
    spec = CATALOGUE.get(code)
    if spec is None:
        return [f"HTTP {status} with a code not in the catalogue: {code}"]
    problems = []
    if not isinstance(message, str):
        problems.append(f"{code}: message is not a string")
    if retriable is not spec.retriable:
        problems.append(f"{code}: retriable={retriable}, the catalogue says {spec.retriable}")
    if status != spec.http_status and (status, code) != (422, "INVALID_REQUEST"):
        problems.append(f"{code} answered with HTTP {status}, not {spec.http_status}")
    if status >= 500 and not (status == 503 and spec.retriable):
        problems.append(f"HTTP {status} {code}: a server error")
    return problems
