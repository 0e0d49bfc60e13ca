"""The security settings both services share: client tokens and TLS.

Mixed into ``CoordinatorSettings`` and ``NodeSettings``, so the flags and ``EOS_*``
variables are spelt the same on every service.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from eos_security.tokens import TokenRegistry

#: The shortest internal token a service accepts: anyone holding it may write markers.
MIN_INTERNAL_TOKEN_LENGTH = 32


class SecuritySettings(BaseSettings):
    internal_token: str | None = Field(
        default=None,
        description=f"Token of internal calls between the services (at least "
        f"{MIN_INTERNAL_TOKEN_LENGTH} characters, e.g. `openssl rand -hex 24`).",
    )
    auth_tokens_file: Path | None = Field(
        default=None,
        description="TOML file of client tokens (hashed) and their principals; "
        "turns authentication and ACLs on.",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate (chain) to serve HTTPS with."
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of --tls-cert.")
    tls_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle trusted for calls to other services (default: system).",
    )

    @field_validator("internal_token", mode="after")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        """A short internal token can be guessed; a service refuses to start with one."""
        if value is None or value == "":
            return None
        if len(value) < MIN_INTERNAL_TOKEN_LENGTH:
            raise ValueError(
                f"the internal token must be at least {MIN_INTERNAL_TOKEN_LENGTH} characters "
                f"(it has {len(value)}); make one with `openssl rand -hex 24`"
            )
        return value

    @field_validator("auth_tokens_file", "tls_cert", "tls_key", "tls_ca_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """``EOS_AUTH_TOKENS_FILE=`` (as compose passes an unset variable) means none."""
        return None if value == "" else value

    @model_validator(mode="after")
    def _tls_pair(self) -> SecuritySettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    def token_registry(self) -> TokenRegistry | None:
        return TokenRegistry(self.auth_tokens_file) if self.auth_tokens_file else None

    def client_verify(self) -> ssl.SSLContext | bool:
        """What httpx's ``verify=`` should be for calls to the other services."""
        if self.tls_ca_file is None:
            return True
        return ssl.create_default_context(cafile=str(self.tls_ca_file))
