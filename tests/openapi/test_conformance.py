"""The live services answer as their documents say (schemathesis' response checks).

Both documents are loaded from the running processes' ``/openapi.json``; every operation
gets a bounded number of generated requests, and every answer must have a documented
status, content type, headers and body schema, and hold to the contract's rule for errors
(``tests/support/envelope.py``: no 5xx but a retriable 503, every error in the envelope
with its catalogue code, status and ``retriable`` flag).
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.cluster import Cluster, ClusterFactory
from tests.support.envelope import envelope_problems
from tests.support.nodes import INTERNAL_TOKEN

pytestmark = pytest.mark.slow

CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = settings(
    max_examples=10,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
HEADERS = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}


@pytest.fixture(scope="module")
def conformance_cluster(module_cluster_factory: ClusterFactory) -> Cluster:
    """A cluster of the module's own (so one worker), stopped with it: the generated
    requests create topics of up to 1,000 partitions, which in a shared cluster would stay
    in every heartbeat answer of its nodes for the rest of the session."""
    return module_cluster_factory()


def _service_url(cluster: Cluster, service: str) -> str:
    return cluster.url if service == "coordinator" else cluster.nodes[0].url


def _call(case: Any, base_url: str) -> None:
    for where in (case.query, case.body):  # a fetch's query, or a fetch-many's body
        if isinstance(where, dict) and "max_wait_ms" in where:
            where["max_wait_ms"] = 0  # a long poll only slows the run down
    # A generated topic may have up to 1,000 partitions: the coordinator creates them on
    # the nodes in batches now, but beside the rest of the suite on two cores one creation
    # (and the leaderships that follow it) may still take many seconds.
    response = case.call_and_validate(
        base_url=base_url, headers=HEADERS, checks=CHECKS, timeout=120
    )
    # No 5xx but a retriable 503, and every error in the envelope with its catalogue code,
    # status and retriable flag.
    problems = envelope_problems(response.status_code, response.content)
    assert not problems, f"{case.operation.label}: {problems}"


def _described(exc: BaseException) -> str:
    """The exception and, for a group (Hypothesis' flaky-failure report), each of the
    exceptions inside: the check that failed, not only that one did."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        text += "".join(f"\n  - {_described(inner)}" for inner in exc.exceptions)
    return text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("service", ["coordinator", "node"])
def test_answers_match_the_document(
    conformance_cluster: Cluster, service: str, mode: GenerationMode
) -> None:
    base_url = _service_url(conformance_cluster, service)
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @EXAMPLES
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            _call(case, base_url)

        try:
            run()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, operation.label  # nothing to make invalid
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.label}: {_described(exc)}")
    assert not failures, "\n\n".join(failures)
