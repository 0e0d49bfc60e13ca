"""Unit tests of the access rules: binding validation, Kafka's matching rules, tokens."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from eos_protocol.acl import AclBinding, AclFilter, Operation, ResourceType
from eos_security import tokens as tokens_module
from eos_security.authorizer import Authorizer
from eos_security.tokens import TokenFileError, TokenRegistry, hash_token, new_token, parse_tokens

pytestmark = pytest.mark.unit

T, G, X, C = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID,
              ResourceType.CLUSTER)


def allow(principal: str, rtype: ResourceType, name: str, op: str, *, prefixed: bool = False,
          deny: bool = False) -> AclBinding:
    return AclBinding.model_validate({
        "principal": principal, "resource_type": rtype, "resource_name": name,
        "pattern_type": "prefixed" if prefixed else "literal", "operation": op,
        "permission": "deny" if deny else "allow",
    })


def test_literal_prefixed_and_wildcard_patterns() -> None:
    auth = Authorizer()
    auth.replace([
        allow("User:a", T, "orders", "write"),
        allow("User:a", T, "logs-", "read", prefixed=True),
        allow("User:b", T, "*", "describe"),
    ])
    assert auth.allowed("User:a", T, "orders", Operation.WRITE)
    assert not auth.allowed("User:a", T, "orders2", Operation.WRITE)
    assert auth.allowed("User:a", T, "logs-app", Operation.READ)
    assert not auth.allowed("User:a", T, "log", Operation.READ)
    assert auth.allowed("User:b", T, "anything", Operation.DESCRIBE)
    assert not auth.allowed("User:b", T, "anything", Operation.READ)
    assert not auth.allowed("User:c", T, "orders", Operation.WRITE)
    # the resource type matters: a topic rule says nothing about a group of the same name
    assert not auth.allowed("User:a", G, "orders", Operation.READ)


def test_deny_wins_and_all_covers_everything() -> None:
    auth = Authorizer()
    auth.replace([
        allow("User:a", T, "*", "all"),
        allow("User:a", T, "secret", "write", deny=True),
        allow("User:*", T, "public", "read"),
        allow("User:*", T, "banned-", "all", prefixed=True, deny=True),
    ])
    assert auth.allowed("User:a", T, "orders", Operation.CREATE)
    assert auth.allowed("User:a", T, "secret", Operation.READ)
    assert not auth.allowed("User:a", T, "secret", Operation.WRITE)
    assert auth.allowed("User:zed", T, "public", Operation.READ)
    assert not auth.allowed("User:a", T, "banned-x", Operation.DESCRIBE)


def test_read_write_alter_imply_describe_but_a_deny_of_them_does_not() -> None:
    auth = Authorizer()
    auth.replace([
        allow("User:a", T, "t", "read"),
        allow("User:a", X, "tx", "write"),
        allow("User:a", C, "cluster", "alter"),
        allow("User:b", T, "t", "all"),
        allow("User:b", T, "t", "read", deny=True),
    ])
    assert auth.allowed("User:a", T, "t", Operation.DESCRIBE)
    assert auth.allowed("User:a", X, "tx", Operation.DESCRIBE)
    assert auth.allowed("User:a", C, "cluster", Operation.DESCRIBE)
    assert not auth.allowed("User:a", T, "t", Operation.WRITE)
    assert auth.allowed("User:b", T, "t", Operation.DESCRIBE)  # deny read leaves describe
    assert not auth.allowed("User:b", T, "t", Operation.READ)


def test_super_users_and_replacing_the_rules_drops_cached_decisions() -> None:
    auth = Authorizer(super_users=["User:root"])
    auth.replace([allow("User:a", T, "t", "write")])
    assert auth.allowed("User:root", C, "cluster", Operation.ALTER)
    assert auth.allowed("User:a", T, "t", Operation.WRITE)
    auth.replace([])
    assert not auth.allowed("User:a", T, "t", Operation.WRITE)
    auth.replace([], super_users=[])
    assert not auth.allowed("User:root", C, "cluster", Operation.ALTER)


def test_allowed_somewhere_is_kip_679s_idempotent_write_test() -> None:
    auth = Authorizer()
    auth.replace([
        allow("User:a", T, "out-", "write", prefixed=True),
        allow("User:b", T, "only", "write"),
        allow("User:b", T, "only", "write", deny=True),
        allow("User:c", T, "x", "read"),
    ])
    assert auth.allowed_somewhere("User:a", T, Operation.WRITE)
    assert not auth.allowed_somewhere("User:b", T, Operation.WRITE)
    assert not auth.allowed_somewhere("User:c", T, Operation.WRITE)


@pytest.mark.parametrize(
    "binding",
    [
        {"resource_type": "group", "operation": "write"},
        {"resource_type": "transactional_id", "operation": "read"},
        {"resource_type": "cluster", "resource_name": "other", "operation": "alter"},
        {"resource_type": "topic", "resource_name": "*", "pattern_type": "prefixed",
         "operation": "read"},
        {"resource_type": "topic", "operation": "read", "principal": "alice"},
        {"resource_type": "topic", "operation": "fly"},
        {"resource_type": "topic", "operation": "read", "permission": "maybe"},
    ],
)
def test_incoherent_bindings_are_refused(binding: dict[str, str]) -> None:
    values = {"principal": "User:a", "resource_name": "t", **binding}
    with pytest.raises(ValidationError):
        AclBinding.model_validate(values)


def test_filters_match_on_the_fields_they_name() -> None:
    binding = allow("User:a", T, "t", "read")
    assert AclFilter(principal="User:a").matches(binding)
    assert AclFilter(resource_type=T, resource_name="t").matches(binding)
    assert not AclFilter(principal="User:b").matches(binding)
    assert not AclFilter(operation=Operation.WRITE).matches(binding)


def test_tokens_file_holds_hashes_only(tmp_path: Path) -> None:
    token = new_token()
    text = f'[[tokens]]\nprincipal = "User:a"\nsha256 = "{hash_token(token)}"\n'
    assert parse_tokens(text) == {hash_token(token): "User:a"}
    with pytest.raises(TokenFileError, match="never the token"):
        parse_tokens(f'[[tokens]]\nprincipal = "User:a"\ntoken = "{token}"\n')
    for bad in (
        '[[tokens]]\nprincipal = "alice"\nsha256 = "' + "0" * 64 + '"\n',
        '[[tokens]]\nprincipal = "User:*"\nsha256 = "' + "0" * 64 + '"\n',
        '[[tokens]]\nprincipal = "User:a"\nsha256 = "abc"\n',
        '[[tokens]]\nprincipal = "User:a"\nsha256 = "' + "0" * 64 + '"\n' * 2,
        "tokens = 3\n",
        "not toml [",
    ):
        with pytest.raises(TokenFileError):
            parse_tokens(bad)


def test_registry_follows_the_file_and_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens_module, "RELOAD_CHECK_S", 0.0)
    first, second = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(f'[[tokens]]\nprincipal = "User:a"\nsha256 = "{hash_token(first)}"\n')
    registry = TokenRegistry(path)
    assert registry.principal(first) == "User:a"
    assert registry.principal(second) is None

    def rewrite(text: str) -> None:
        path.write_text(text)
        stamp = time.time() + 5  # a distinct mtime even on a coarse clock
        os.utime(path, (stamp, stamp))

    rewrite(f'[[tokens]]\nprincipal = "User:b"\nsha256 = "{hash_token(second)}"\n')
    assert registry.principal(second) == "User:b"
    assert registry.principal(first) is None  # revoked
    rewrite("broken [")
    assert registry.principal(second) == "User:b"
