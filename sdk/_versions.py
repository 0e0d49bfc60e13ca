"""What the client may ask of the cluster it talks to (docs/design.md, "Versions and
compatibility"). No I/O here.

The coordinator names its features in ``GET /v1/metadata`` (``eos_protocol.versions``);
the client learns them with the live coordinators and decides from them, before it sends
anything, which request shape to use:

* a transactional producer that asked for no transaction version speaks the highest one
  both sides know (2 from a cluster that names it, 1 otherwise, sent as the previous
  release's clients send it: without the field);
* a request the cluster would not understand (an explicit transaction version it lacks, a
  topic option or an endpoint of a newer protocol) fails at once with
  ``UNSUPPORTED_VERSION`` naming both versions, instead of the old server's confusing
  ``INVALID_REQUEST: Extra inputs are not permitted``.
"""

from __future__ import annotations

from typing import Any

from eos_protocol.errors import EosError, InvalidRequestError, UnsupportedVersionError
from eos_protocol.versions import (
    RELEASE,
    TRANSACTION_VERSION_1,
    TRANSACTION_VERSION_2,
    ClusterFeatures,
)

#: The transaction versions this client speaks, oldest first.
CLIENT_TRANSACTION_VERSIONS = (TRANSACTION_VERSION_1, TRANSACTION_VERSION_2)


def choose_transaction_version(asked: int | None, features: ClusterFeatures) -> int:
    """The transaction version an init asks for: ``asked`` when the cluster speaks it,
    else the highest both sides speak. ``UnsupportedVersionError`` when there is none."""
    supported = features.transaction_version
    lowest, highest = CLIENT_TRANSACTION_VERSIONS[0], CLIENT_TRANSACTION_VERSIONS[-1]
    if asked is None:
        chosen = supported.highest_common(lowest, highest)
        if chosen is None:
            raise UnsupportedVersionError(
                f"the cluster ({features.release_name}) speaks transaction version "
                f"{supported}; this client ({RELEASE}) speaks {lowest} to {highest}"
            )
        return chosen
    if supported.highest_common(asked, asked) is None:
        raise unsupported_transaction_version(asked, features)
    return asked


def unsupported_transaction_version(asked: int, features: ClusterFeatures) -> EosError:
    """The error of a producer that asked for a transaction version the cluster lacks."""
    return UnsupportedVersionError(
        f"this producer asked for transaction version {asked}, but the cluster "
        f"({features.release_name}) supports transaction version "
        f"{features.transaction_version} only; leave transaction_version unset to use the "
        "highest both support"
    )


def require_protocol(features: ClusterFeatures, needed: int, what: str, hint: str = "") -> None:
    """Refuse ``what`` before it is sent when the cluster's request protocol is older
    than ``needed`` (the old server would refuse it with a confusing INVALID_REQUEST)."""
    if features.protocol >= needed:
        return
    raise UnsupportedVersionError(
        f"{what} needs request protocol {needed} (this client, {RELEASE}, speaks it), but "
        f"the cluster ({features.release_name}) speaks protocol {features.protocol}"
        + (f"; {hint}" if hint else "")
    )


def refused_field(exc: BaseException, field: str) -> bool:
    """Whether ``exc`` is a schema refusal of the request body's ``field``: what a
    coordinator of an older release answers to a field it does not know (its request
    models forbid unknown fields)."""
    if not isinstance(exc, InvalidRequestError):
        return False
    problems: Any = exc.details.get("problems")
    if not isinstance(problems, list):
        return False
    return any(isinstance(p, dict) and p.get("loc") == ["body", field] for p in problems)
