"""Generates the blocking twins of the straight-line async clients (consumer, admin).

The async module is the source; its sync twin is the same text with ``await`` and
``async`` taken out and the async names swapped for the blocking ones (httpx's own
approach). ``python -m sdk._unasync`` rewrites the twins; ``tests/sdk/test_twins.py``
fails if a twin drifts from what this produces. The producers are not generated: their
concurrency (a sender thread and workers, or tasks) differs in kind, so they share
``ProducerCore`` instead.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

#: (async source, generated sync twin)
TWINS = [
    ("aio/consumer.py", "consumer.py"),
    ("aio/admin.py", "admin.py"),
]

_RULES: list[tuple[str, str]] = [
    (r"^# The twins share their signatures.*\n(?:#.*\n)*\n", ""),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\bAsyncTransport\b", "SyncTransport"),
    (r"\bhttpx\.AsyncBaseTransport\b", "httpx.BaseTransport"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"sdk\.aio\.", "sdk."),
    (r"\(async twin\)", "(blocking twin)"),
    (r"import SyncTransport, Req\b", "import Req, SyncTransport"),
]

HEADER = "# Generated from sdk/{source} by sdk/_unasync.py: edit that file, not this one.\n"


def unasync(text: str, source: str) -> str:
    for pattern, replacement in _RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return HEADER.format(source=source) + text


def generate() -> dict[Path, str]:
    return {ROOT / sync: unasync((ROOT / src).read_text(), src) for src, sync in TWINS}


def main() -> int:
    for path, text in generate().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
