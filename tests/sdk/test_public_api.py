"""The public surface: complete re-exports, documented classes, twins that match."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import sdk
from sdk import _unasync

pytestmark = pytest.mark.unit

PUBLIC_CLIENTS = [
    ("TransactionalProducer", "AsyncTransactionalProducer"),
    ("Producer", "AsyncProducer"),
    ("Consumer", "AsyncConsumer"),
    ("AdminClient", "AsyncAdminClient"),
]


def _sdk_modules() -> list[str]:
    names = ["sdk"]
    for info in pkgutil.walk_packages(sdk.__path__, "sdk."):
        if not info.name.startswith("eos_protocol"):
            names.append(info.name)
    return names


def test_every_public_class_is_exported_from_the_package() -> None:
    """A class defined in the SDK without a leading underscore is public: it must be
    importable from ``sdk`` itself."""
    missing = []
    for name in _sdk_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("_") or not inspect.isclass(value):
                continue
            if value.__module__ != name or name.rsplit(".", 1)[-1].startswith("_"):
                continue
            if attr not in sdk.__all__:
                missing.append(f"{name}.{attr}")
    assert missing == []


def test_all_names_resolve_and_are_sorted() -> None:
    for name in sdk.__all__:
        assert hasattr(sdk, name), name
    assert len(set(sdk.__all__)) == len(sdk.__all__)


def _own_public_classes() -> list[str]:
    """Public classes the SDK defines itself (the wire errors come from eos_protocol)."""
    return [
        name for name in sdk.__all__
        if inspect.isclass(getattr(sdk, name))
        and not getattr(sdk, name).__module__.startswith("eos_protocol")
    ]


@pytest.mark.parametrize("name", _own_public_classes())
def test_public_classes_document_an_example(name: str) -> None:
    doc = inspect.getdoc(getattr(sdk, name)) or ""
    assert "Example::" in doc or ">>>" in doc, f"{name} has no example"


@pytest.mark.parametrize(("sync_name", "async_name"), PUBLIC_CLIENTS)
def test_twins_have_the_same_methods_and_signatures(sync_name: str, async_name: str) -> None:
    sync_cls, async_cls = getattr(sdk, sync_name), getattr(sdk, async_name)

    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            n: inspect.signature(m)
            for n, m in inspect.getmembers(cls, callable)
            if not n.startswith("_")
        }

    sync_api, async_api = public(sync_cls), public(async_cls)
    extra = {"send_and_wait"}  # an async convenience: ``await (await send(...))``
    assert set(sync_api) == set(async_api) - extra
    for method, signature in sync_api.items():
        assert list(signature.parameters) == list(async_api[method].parameters), method


def test_generated_twins_have_not_drifted() -> None:
    for path, text in _unasync.generate().items():
        assert path.read_text() == text, (
            f"{path.name} differs from its async source: run python -m sdk._unasync"
        )


def test_package_is_typed() -> None:
    assert (Path(sdk.__file__).parent / "py.typed").exists()


def test_use_default_differs_from_none() -> None:
    from sdk._config import resolve_timeout

    assert resolve_timeout(sdk.USE_DEFAULT, 2500) == 2.5
    assert resolve_timeout(None, 2500) is None
    assert repr(sdk.USE_DEFAULT) == "USE_DEFAULT"


def test_a_rule_that_never_fires_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_unasync, "_RULES", [*_unasync._RULES, (r"\bno_such_name\b", "x")])
    with pytest.raises(_unasync.DeadRuleError, match="no_such_name"):
        _unasync.generate()
