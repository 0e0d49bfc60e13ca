"""Bearer tokens: which principal a token stands for, from a file that holds only hashes.

The file (``--auth-tokens-file``) is TOML, one ``[[tokens]]`` table per token::

    [[tokens]]
    principal = "User:etl"
    sha256 = "3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b"

A token is a random secret of 256 bits (``eos auth new-token`` makes one and prints its
line), so a single SHA-256 is the right hash: nothing can be guessed from it, and checking
a request costs a microsecond instead of the tens of milliseconds of a password hash. The
lookup is by hash, so comparing the presented token never runs byte by byte over a stored
secret. Whoever reads the file learns no token, so it may be shared by every service.

The file is read again when it changes (checked at most once a second), so tokens can be
added and revoked without a restart; a file that no longer parses keeps the last good
set and is logged, so a typo cannot lock everybody out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from eos_protocol.acl import PRINCIPAL_RE, WILDCARD

log = logging.getLogger("eos.auth")

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
RELOAD_CHECK_S = 1.0


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe base64 (43 characters)."""
    return "eos_" + secrets.token_urlsafe(32)


def token_entry(principal: str, token: str) -> str:
    """The TOML lines that give ``token`` to ``principal`` in a tokens file."""
    return f'[[tokens]]\nprincipal = "{principal}"\nsha256 = "{hash_token(token)}"\n'


class TokenFileError(ValueError):
    """The tokens file is missing, unreadable or malformed."""


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, str]:
    """``{sha256: principal}`` from the file's text; raises ``TokenFileError``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"tokens"}
    if unknown:
        raise TokenFileError(f"{source}: unknown keys {sorted(unknown)}; expected [[tokens]]")
    entries = data.get("tokens", [])
    if not isinstance(entries, list):
        raise TokenFileError(f"{source}: 'tokens' must be an array of tables ([[tokens]])")
    hashes: dict[str, str] = {}
    for number, entry in enumerate(entries, start=1):
        where = f"{source}: token {number}"
        if not isinstance(entry, dict):
            raise TokenFileError(f"{where}: expected a table")
        extra = set(entry) - {"principal", "sha256", "comment"}
        if "token" in extra:
            raise TokenFileError(f"{where}: store the token's sha256, never the token itself")
        if extra:
            raise TokenFileError(f"{where}: unknown keys {sorted(extra)}")
        principal, digest = entry.get("principal"), entry.get("sha256")
        if not isinstance(principal, str) or not PRINCIPAL_RE.fullmatch(principal):
            raise TokenFileError(f"{where}: principal must look like 'User:name'")
        if principal.endswith(":" + WILDCARD):
            raise TokenFileError(f"{where}: 'User:*' is a pattern, not a principal")
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            raise TokenFileError(f"{where}: sha256 must be 64 lowercase hex digits")
        if digest in hashes:
            raise TokenFileError(f"{where}: the same token is listed twice")
        hashes[digest] = principal
    return hashes


@dataclass(frozen=True)
class _Loaded:
    hashes: dict[str, str]
    stamp: tuple[int, int]  # (mtime_ns, size) of the file it came from


class TokenRegistry:
    """The principals of a tokens file, kept current with the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._loaded = self._load()
        self._checked_at = time.monotonic()

    @classmethod
    def from_hashes(cls, hashes: dict[str, str]) -> TokenRegistry:
        """A registry that is not backed by a file (tests, embedded use)."""
        registry = cls.__new__(cls)
        registry.path = Path()
        registry._loaded = _Loaded(dict(hashes), (0, 0))
        registry._checked_at = float("inf")
        return registry

    def _stamp(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _load(self) -> _Loaded:
        try:
            stamp = self._stamp()
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenFileError(f"cannot read tokens file {self.path}: {exc}") from None
        return _Loaded(parse_tokens(text, str(self.path)), stamp)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < RELOAD_CHECK_S:
            return
        self._checked_at = now
        try:
            if self._stamp() == self._loaded.stamp:
                return
            self._loaded = self._load()
            log.info("tokens file %s reloaded: %d tokens", self.path, len(self._loaded.hashes))
        except (OSError, TokenFileError) as exc:
            log.error("tokens file %s not reloaded, keeping the last good one: %s",
                      self.path, exc)

    def principal(self, token: str) -> str | None:
        """The principal ``token`` stands for, or None for an unknown token."""
        self._refresh()
        return self._loaded.hashes.get(hash_token(token))

    def knows_hash(self, digest: str) -> bool:
        return digest in self._loaded.hashes

    def __len__(self) -> int:
        return len(self._loaded.hashes)
