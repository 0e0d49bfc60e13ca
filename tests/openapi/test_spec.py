"""The committed OpenAPI documents: in step with the code, valid, and complete."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel
from pydantic_core import to_jsonable_python
from typer.testing import CliRunner

from eos_cli.main import app
from eos_cli.openapi_command import render_spec as render_fresh
from eos_protocol import acl as protocol_acl
from eos_protocol import common as protocol_common
from eos_protocol import coordinator as protocol_coordinator
from eos_protocol import fetch_many as protocol_fetch_many
from eos_protocol import hanging as protocol_hanging
from eos_protocol import listing as protocol_listing
from eos_protocol import node as protocol_node
from eos_protocol import replica as protocol_replica
from eos_protocol import replication as protocol_replication
from eos_protocol import versions as protocol_versions
from eos_protocol.common import ErrorEnvelope
from eos_protocol.errors import CATALOGUE
from tests.openapi.conftest import DOCS

pytestmark = pytest.mark.unit

SERVICES = {"coordinator": "coordinator.json", "node": "node.json"}

OPERATION_IDS = {
    "coordinator": {
        "initTransactions", "addPartitionsToTxn", "addOffsetsToTxn", "commitTransaction",
        "abortTransaction", "describeTransaction", "listTransactions", "forceAbortTransaction",
        "findCoordinator", "createTopic", "describeTopic", "getMetadata", "allocateProducerId",
        "getProducerTransaction", "addProducerPartition", "health", "ready", "metrics",
        "listAcls", "createAcls", "deleteAcls", "getAclSnapshot", "getLiveCoordinators",
        "nodeHeartbeat", "alterPartition", "alterPartitions", "alterTopicConfig",
        "listHangingTransactions", "abortHangingTransaction", "consumerGroupHeartbeat",
        "listGroups", "describeGroup", "deleteGroup", "resetGroupOffsets", "commitMemberOffsets",
        "deleteTopic",
    },
    "node": {
        "produceRecords", "fetchRecords", "getPartitionOffsets", "describeProducers",
        "commitGroupOffsets", "commitTransactionalOffsets", "fetchGroupOffsets",
        "writeTxnMarkers", "createPartition", "listNodePartitions", "health", "ready",
        "metrics", "replicaFetch", "epochEnd", "pushPartitionState", "listOpenTransactions",
        "createPartitions", "pushPartitionStates", "replicaFetchMany", "epochEnds",
        "describeNodePartitions", "fetchMany", "produceToPartitions",
        "describeProducersOfPartitions", "deleteTopicsOnNode",
    },
}


@functools.cache
def render_spec(service: str) -> str:
    """The document the code makes, built once per run: building one means building the
    service's whole application, and half the tests here read it."""
    return render_fresh(service)


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    ]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_committed_document_matches_the_code(service: str) -> None:
    committed = (DOCS / SERVICES[service]).read_text(encoding="utf-8")
    assert committed == render_spec(service), (
        f"docs/openapi/{SERVICES[service]} is out of date; run "
        f"`eos openapi --service {service} --output docs/openapi/{SERVICES[service]}`"
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_document_is_valid_openapi(service: str) -> None:
    validate(json.loads((DOCS / SERVICES[service]).read_text(encoding="utf-8")))


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_operations_are_named_tagged_and_described(service: str) -> None:
    spec = json.loads(render_spec(service))
    ops = _operations(spec)
    assert {op["operationId"] for _, _, op in ops} == OPERATION_IDS[service]
    for method, path, op in ops:
        where = f"{method.upper()} {path}"
        assert op.get("tags"), where
        assert op.get("summary"), where
        for status, answer in op["responses"].items():
            for media, content in answer.get("content", {}).items():
                schema = content["schema"]
                if media == "application/json":
                    assert "$ref" in schema, f"{where} {status}: body is not a named schema"
        body = op.get("requestBody")
        if body is not None:
            assert "$ref" in body["content"]["application/json"]["schema"], where


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_error_answer_is_the_envelope_with_its_codes(service: str) -> None:
    spec = json.loads(render_spec(service))
    for method, path, op in _operations(spec):
        if op["operationId"] in {"health", "metrics", "ready"} and service == "coordinator":
            continue
        errors = {s: a for s, a in op["responses"].items() if int(s) >= 400}
        if op["operationId"] not in {"health", "metrics"}:
            assert "422" in errors, f"{method.upper()} {path}"
        for answer in errors.values():
            content = answer["content"]["application/json"]
            assert content["schema"] == {"$ref": "#/components/schemas/ErrorEnvelope"}
            codes = set(content["examples"])
            assert codes and "code is one of: " in answer["description"]
            for code, example in content["examples"].items():
                assert example["value"]["error"]["code"] == code
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_no_bare_objects() -> None:
    """Every object in either document is a named schema or a map of typed values."""

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" not in node:
                assert isinstance(node.get("additionalProperties"), dict), where
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    for service in SERVICES:
        walk(json.loads(render_spec(service)), service)


def test_cli_writes_the_document(tmp_path: Any) -> None:
    out = tmp_path / "node.json"
    result = CliRunner().invoke(app, ["openapi", "--service", "node", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == render_spec("node")


def _wire_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for module in (
        protocol_common, protocol_coordinator, protocol_node, protocol_hanging, protocol_acl,
        protocol_replica, protocol_replication, protocol_versions, protocol_listing,
        protocol_fetch_many,
    ):  # fmt: skip
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel) and value not in found:
                found.append(value)
    return found


@pytest.mark.parametrize("model", _wire_models(), ids=lambda m: m.__name__)
def test_schema_examples_are_valid(model: type[BaseModel]) -> None:
    """Every example a schema shows is accepted by the model it documents."""
    extra = model.model_config.get("json_schema_extra")
    for example in extra.get("examples", []) if isinstance(extra, dict) else []:
        model.model_validate(example)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_schema_examples_are_the_models_own(service: str) -> None:
    """A schema shows its model's examples as written, nulls included: FastAPI's encoder
    drops every null, and an answer's nullable fields are there even when null."""
    by_title = {
        schema.get("title"): schema
        for schema in json.loads(render_spec(service))["components"]["schemas"].values()
    }
    shown = 0
    for model in _wire_models():
        extra = model.model_config.get("json_schema_extra")
        written = extra.get("examples") if isinstance(extra, dict) else None
        schema = by_title.get(model.__name__)
        if written and schema is not None:
            assert schema.get("examples") == to_jsonable_python(written), model.__name__
            shown += 1
    assert shown


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_error_examples_use_catalogue_codes(service: str) -> None:
    spec = json.loads(render_spec(service))
    for _method, _path, op in _operations(spec):
        for status, answer in op["responses"].items():
            for code, example in answer.get("content", {}).get("application/json", {}).get(
                "examples", {}
            ).items():
                ErrorEnvelope.model_validate(example["value"])
                assert code in CATALOGUE
                expected = 422 if code == "INVALID_REQUEST" else CATALOGUE[code].http_status
                assert int(status) in {expected, CATALOGUE[code].http_status}
