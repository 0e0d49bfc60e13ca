"""The contract in eos_protocol matches docs/design.md §3 and §4."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from eos_protocol import errors
from eos_protocol.errors import CATALOGUE, ErrorClass, error_for
from eos_protocol.versions import RELEASE

pytestmark = pytest.mark.unit

DESIGN_CODES = {
    400: ["INVALID_REQUEST", "INVALID_TRANSACTION_TIMEOUT", "INVALID_RECORD",
          "INVALID_REGULAR_EXPRESSION"],
    401: ["UNAUTHENTICATED"],
    403: [
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
    ],
    404: ["UNKNOWN_TOPIC_OR_PARTITION", "TRANSACTIONAL_ID_NOT_FOUND", "UNKNOWN_PRODUCER_ID",
          "UNKNOWN_MEMBER_ID", "GROUP_ID_NOT_FOUND"],
    409: [
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "INVALID_PRODUCER_ID_MAPPING",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "TRANSACTION_COORDINATOR_FENCED",
        "TOPIC_ALREADY_EXISTS",
        "TRANSACTION_ABORTABLE",
        "FENCED_MEMBER_EPOCH",
        "UNRELEASED_INSTANCE_ID",
        "GROUP_MAX_SIZE_REACHED",
        "NON_EMPTY_GROUP",
    ],
    413: ["MESSAGE_TOO_LARGE"],
    503: [
        "NOT_COORDINATOR",
        "COORDINATOR_NOT_AVAILABLE",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "CONCURRENT_TRANSACTIONS",
        "NOT_LEADER_OR_FOLLOWER",
        "UNSTABLE_OFFSET_COMMIT",
        "KAFKA_STORAGE_ERROR",
    ],
}


@pytest.mark.parametrize(
    ("status", "code"), [(s, c) for s, codes in DESIGN_CODES.items() for c in codes]
)
def test_every_design_code_has_its_status(status: int, code: str) -> None:
    assert CATALOGUE[code].http_status == status
    assert CATALOGUE[code].retriable == (status == 503)


def test_classes_follow_kafka() -> None:
    fatal = {
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_PRODUCER_ID_MAPPING",
        "INVALID_TXN_STATE",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    }
    abortable = {
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "UNKNOWN_PRODUCER_ID",
        "TRANSACTION_ABORTABLE",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
    }
    for code in fatal:
        assert CATALOGUE[code].error_class is ErrorClass.FATAL, code
    for code in abortable:
        assert CATALOGUE[code].error_class is ErrorClass.ABORTABLE, code
    for spec in CATALOGUE.values():
        assert [spec.retriable, spec.abortable, spec.fatal].count(True) <= 1


def test_error_for_builds_the_right_class_and_envelope() -> None:
    error = error_for("PRODUCER_FENCED", "old epoch")
    assert isinstance(error, errors.ProducerFencedError)
    assert isinstance(error, errors.FatalError)
    assert error.envelope() == {
        "error": {"code": "PRODUCER_FENCED", "message": "old epoch", "retriable": False}
    }
    assert isinstance(error_for("SOMETHING_NEW"), errors.InternalError)


def test_the_release_is_the_package_version() -> None:
    """The features a coordinator names carry ``RELEASE``; the package says the same."""
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == RELEASE


def test_unsupported_version_is_fatal() -> None:
    """A producer that asked for a version the cluster lacks would ask for it again."""
    error = error_for("UNSUPPORTED_VERSION", "transaction version 2")
    assert isinstance(error, errors.UnsupportedVersionError)
    assert CATALOGUE["UNSUPPORTED_VERSION"].error_class is ErrorClass.FATAL
