"""URL path segments: every name or id that goes into a request path goes through here.

A topic named ``..`` or a transactional id holding ``/`` must reach the server as one
segment, or the path changes meaning: ``/internal/v1/partitions/../0`` collapses into
``/internal/v1/0`` and answers 404, which a caller may take for "node away" and retry for
ever. Percent-encoding carries every character but the two dot segments, which RFC 3986
removes before routing whatever their spelling (``%2E%2E`` included); so those two are
refused here, as Kafka refuses them as topic names, and every builder of a path —
coordinator to node, node to coordinator, SDK, CLI and Spark — uses ``segment``.
"""

from __future__ import annotations

from urllib.parse import quote

from eos_protocol.errors import InvalidRequestError

#: The dot segments no encoding can carry through URL normalisation.
DOT_SEGMENTS = frozenset({".", ".."})


def segment(value: str | int) -> str:
    """``value`` as one percent-encoded path segment.

    Raises INVALID_REQUEST for an empty value or a dot segment, which no server could
    route back to the same name.
    """
    text = str(value)
    if not text:
        raise InvalidRequestError("an empty name cannot be a path segment")
    if text in DOT_SEGMENTS:
        raise InvalidRequestError(f"{text!r} cannot be a path segment (RFC 3986 dot segment)")
    return quote(text, safe="")


def join(base: str, *parts: str | int) -> str:
    """``base`` followed by ``parts``, each encoded by ``segment``.

    Example::

        join("http://n1:9091/internal/v1/partitions", "orders", 3)
        # 'http://n1:9091/internal/v1/partitions/orders/3'
    """
    return "/".join([base.rstrip("/"), *(segment(p) for p in parts)])
