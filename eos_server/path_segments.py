"""Path segments that hold ``/``: a transactional or group id such as ``etl/orders``.

The contract (docs/design.md, *Names in paths*) puts every id in a URL path as one
percent-encoded segment, so ``etl/orders`` travels as ``etl%2Forders``. The ASGI server
decodes the path before routing (``scope["path"]`` is ``/v1/transactions/etl/orders/init``),
and the router then sees two segments where the client sent one: the request was answered
404. Kafka's ids may hold any character, and so may ours.

So routing sees the path as the client sent it, on two conditions:

* ``routable_path`` (applied by ``RequestShape`` to every request whose raw path holds a
  percent-escape) decodes every escape but ``%2F`` and ``%25``, which stay escaped: a
  routed path holds ``%`` only as part of those two, and ``/`` only between segments;
* every ``str`` path parameter is read back through ``SegmentConvertor``, which turns
  ``%2F`` into ``/`` and ``%25`` into ``%`` (and every ``path`` one, which may span
  segments, through ``RestConvertor``; both installed for every route by
  ``install_convertor``, before the services define theirs, and used by the fast paths
  through the route's own convertor).

A literal ``%2F`` in an id is sent as ``%252F`` and read back as ``%2F``, not ``/``:
``%25`` is decoded last, in the same pass.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from starlette.convertors import (
    CONVERTOR_TYPES,
    PathConvertor,
    StringConvertor,
    register_url_convertor,
)

#: The escapes a routed path keeps (a segment's own ``/`` and ``%``), upper or lower case.
_KEPT = re.compile(rb"%(2[fF]|25)")
_READ_BACK = re.compile(r"%(2F|25)")


def routable_path(raw_path: bytes) -> str:
    """The path as the router should see it: decoded, but for ``%2F`` and ``%25``
    (normalised to upper case). Bytes that are not UTF-8 are replaced, as the server
    does (``RequestShape`` refuses such a path before this runs)."""
    pieces: list[bytes] = []
    at = 0
    for kept in _KEPT.finditer(raw_path):
        pieces.append(unquote_to_bytes(raw_path[at : kept.start()]))
        pieces.append(kept.group(0).upper())
        at = kept.end()
    pieces.append(unquote_to_bytes(raw_path[at:]))
    return b"".join(pieces).decode("utf-8", errors="replace")


def read_back(segment: str) -> str:
    """A routed path segment as the id it carries."""
    if "%" not in segment:
        return segment
    return _READ_BACK.sub(lambda m: "/" if m.group(1) == "2F" else "%", segment)


class SegmentConvertor(StringConvertor):
    """Starlette's ``str`` convertor (one segment, no ``/``) that reads ``%2F`` and
    ``%25`` back (``routable_path``)."""

    def convert(self, value: str) -> str:
        return read_back(value)


class RestConvertor(PathConvertor):
    """Starlette's ``path`` convertor (the rest of the path, ``/`` included) that reads
    ``%2F`` and ``%25`` back too: a ``{name:path}`` parameter gets the id as sent, whether
    its ``/`` came escaped (as the contract sends it) or not."""

    def convert(self, value: str) -> str:
        return read_back(value)


def install_convertor() -> None:
    """Make every ``{name}`` and ``{name:path}`` parameter of routes defined from now on
    read escaped ``/`` and ``%`` back (``SegmentConvertor``, ``RestConvertor``).
    Idempotent."""
    if not isinstance(CONVERTOR_TYPES.get("str"), SegmentConvertor):
        register_url_convertor("str", SegmentConvertor())
    if not isinstance(CONVERTOR_TYPES.get("path"), RestConvertor):
        register_url_convertor("path", RestConvertor())


__all__ = [
    "RestConvertor", "SegmentConvertor", "install_convertor", "read_back", "routable_path",
]
