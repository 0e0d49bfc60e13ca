"""Service addresses: the one parser of every configured URL and URL list.

A service given an address it cannot use must refuse to start with a clear message, not
start and then fail every request (``COORDINATOR_NOT_AVAILABLE`` for an hour, because
``http://a:1,http://b:2`` was taken as one URL). Lists are comma-separated, as Kafka's
``bootstrap.servers``: ``"http://c1:8080,http://c2:8080"``, or a Python sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

SCHEMES = ("http", "https")


class AddressError(ValueError):
    """An address that no request could use; the message says which and why."""


def check_url(url: str, what: str = "address") -> str:
    """``url`` without a trailing slash, or ``AddressError`` saying what is wrong."""
    text = url.strip()
    if not text:
        raise AddressError(f"{what}: empty URL")
    if any(c.isspace() for c in text) or "," in text:
        raise AddressError(f"{what}: {url!r} is not one URL (a list is comma-separated)")
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise AddressError(f"{what}: {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise AddressError(
            f"{what}: {url!r} has scheme {parts.scheme or '(none)'!r}; use http:// or https://"
        )
    if not parts.hostname:
        raise AddressError(f"{what}: {url!r} names no host")
    if port == 0:
        raise AddressError(f"{what}: {url!r} has port 0")
    if parts.query or parts.fragment:
        raise AddressError(f"{what}: {url!r} must not have a query or fragment")
    return text.rstrip("/")


def parse_url_list(spec: str | Sequence[str], what: str = "addresses") -> list[str]:
    """Every URL of a comma-separated list (or a sequence), checked, in order, without
    repeats; ``AddressError`` when the list is empty or one entry is unusable."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    for item in items:
        if isinstance(spec, str) and not item.strip():
            continue  # "a,,b" and a trailing comma are harmless
        url = check_url(item, what)
        if url not in urls:
            urls.append(url)
    if not urls:
        raise AddressError(f"{what}: no URL given")
    return urls
