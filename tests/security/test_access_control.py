"""``AccessControl`` without HTTP: refusal codes, rules not yet loaded, re-reading the
rules on a denial when they were read before the request arrived."""

from __future__ import annotations

import asyncio
import time

import pytest

from eos_protocol.acl import AclBinding, Operation, ResourceType
from eos_protocol.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from eos_security import access as access_module
from eos_security.access import AccessControl
from eos_security.authorizer import Authorizer
from eos_security.tokens import TokenRegistry

pytestmark = pytest.mark.unit

TOKENS = TokenRegistry.from_hashes({})


def _binding(op: str = "write") -> AclBinding:
    return AclBinding.model_validate({"principal": "User:a", "resource_type": "topic",
                                      "resource_name": "t", "operation": op})


def test_each_resource_type_refuses_with_its_kafka_code() -> None:
    authorizer = Authorizer()
    authorizer.replace([])
    control = AccessControl(TOKENS, authorizer)
    cases = [
        (ResourceType.TOPIC, TopicAuthorizationFailedError),
        (ResourceType.GROUP, GroupAuthorizationFailedError),
        (ResourceType.TRANSACTIONAL_ID, TransactionalIdAuthorizationFailedError),
        (ResourceType.CLUSTER, ClusterAuthorizationFailedError),
    ]
    for rtype, error in cases:
        with pytest.raises(error):
            asyncio.run(control.require("User:a", rtype, "cluster", Operation.DESCRIBE))
    # authentication off: no principal, nothing to check
    asyncio.run(control.require(None, ResourceType.TOPIC, "t", Operation.WRITE))


def test_rules_never_loaded_answer_a_retriable_error_and_are_not_hammered() -> None:
    attempts = 0

    async def down() -> None:
        nonlocal attempts
        attempts += 1
        raise CoordinatorNotAvailableError("coordinator down")

    control = AccessControl(TOKENS, Authorizer(), refresh=down)

    async def burst() -> None:
        for _ in range(20):
            with pytest.raises(CoordinatorNotAvailableError):
                await control.require("User:a", ResourceType.TOPIC, "t", Operation.WRITE)

    asyncio.run(burst())
    assert attempts == 1


def test_a_denial_rereads_rules_read_before_the_request_once() -> None:
    authorizer = Authorizer()
    authorizer.replace([])
    reads = 0

    async def refresh() -> None:
        nonlocal reads
        reads += 1
        authorizer.replace([_binding()])  # meanwhile, someone granted write on t

    control = AccessControl(TOKENS, authorizer, refresh=refresh)
    asyncio.run(control.require("User:a", ResourceType.TOPIC, "t", Operation.WRITE))
    assert reads == 1
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(control.require("User:a", ResourceType.TOPIC, "t", Operation.READ))
    assert reads == 2


def test_requests_arriving_during_the_first_load_wait_for_it() -> None:
    authorizer = Authorizer()
    reads = 0

    async def slow_load() -> None:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        authorizer.replace([_binding()])

    control = AccessControl(TOKENS, authorizer, refresh=slow_load)

    async def together() -> None:
        await asyncio.gather(*(
            control.require("User:a", ResourceType.TOPIC, "t", Operation.WRITE)
            for _ in range(10)
        ))

    asyncio.run(together())
    assert reads == 1


def test_a_read_begun_before_the_request_does_not_settle_its_denial() -> None:
    """The race behind a refused fresh grant: a periodic read starts, the grant lands, the
    request arrives, and the read (with the rules from before the grant) finishes. The
    denial must wait for a read that began after it arrived."""
    authorizer = Authorizer()
    authorizer.replace([])
    granted = False
    reads: list[bool] = []

    async def refresh() -> None:
        started = time.monotonic()
        saw_grant = granted
        await asyncio.sleep(0.05)
        reads.append(saw_grant)
        authorizer.replace([_binding()] if saw_grant else [], as_of=started)

    control = AccessControl(TOKENS, authorizer, refresh=refresh)

    async def scenario() -> None:
        nonlocal granted
        periodic = asyncio.ensure_future(control._join_or_start_read())
        await asyncio.sleep(0.01)  # the read is under way with the old rules
        granted = True
        await control.require("User:a", ResourceType.TOPIC, "t", Operation.WRITE)
        assert await periodic

    asyncio.run(scenario())
    assert reads == [False, True]


def test_after_a_failed_read_denials_do_not_hammer_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    authorizer = Authorizer()
    authorizer.replace([])
    attempts = 0

    async def down() -> None:
        nonlocal attempts
        attempts += 1
        raise CoordinatorNotAvailableError("coordinator down")

    control = AccessControl(TOKENS, authorizer, refresh=down)

    async def burst() -> None:
        for _ in range(20):
            with pytest.raises(TopicAuthorizationFailedError):
                await control.require("User:a", ResourceType.TOPIC, "t", Operation.WRITE)

    asyncio.run(burst())
    assert attempts == 1
    monkeypatch.setattr(access_module, "RETRY_AFTER_FAILED_READ_S", 0.0)
    asyncio.run(burst())
    assert attempts == 21
