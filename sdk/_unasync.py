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
    (r"\bawait ", ""),
    (r"\bAsyncTransport\b", "SyncTransport"),
    (r"\bhttpx\.AsyncBaseTransport\b", "httpx.BaseTransport"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\(async twin\)", "(blocking twin)"),
    (r"\bSyncTransport, Req\b", "Req, SyncTransport"),
]

HEADER = "# Generated from sdk/{source} by sdk/_unasync.py: edit that file, not this one.\n"


class DeadRuleError(Exception):
    """A rule that changed nothing in any twin: the sources moved on and the rule is
    stale (or it is misspelt and the twins only agree by chance)."""


def unasync(text: str, source: str, fired: list[int] | None = None) -> str:
    """The blocking twin of ``text``; ``fired[i]`` counts the changes of rule ``i``."""
    for i, (pattern, replacement) in enumerate(_RULES):
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if fired is not None:
            fired[i] += count
    return HEADER.format(source=source) + text


def generate() -> dict[Path, str]:
    """Every twin's text; raises ``DeadRuleError`` if a rule fired in none of them."""
    fired = [0] * len(_RULES)
    twins = {ROOT / sync: unasync((ROOT / src).read_text(), src, fired) for src, sync in TWINS}
    dead = [pattern for (pattern, _), count in zip(_RULES, fired, strict=True) if not count]
    if dead:
        raise DeadRuleError(f"rules that never fire: {dead}")
    return twins


def main() -> int:
    for path, text in generate().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
