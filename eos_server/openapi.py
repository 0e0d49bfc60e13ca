"""The OpenAPI document each service serves at ``/openapi.json`` (and ``eos openapi``
writes to ``docs/openapi/``): FastAPI's, with what its generator leaves out put back.

* ``servers``: FastAPI lists none, and a document without them leaves a generated client
  or a documentation tool no address to start from. Each service names where it listens
  when started as documented; the first entry is relative (``/``), so the interactive
  docs a running service serves keep calling that service, wherever it runs.
* ``null`` in the models' examples: FastAPI encodes the whole document with
  ``exclude_none``, which also drops every ``null`` inside an example. An answer carries
  its nullable fields even when they are null (``"error": null`` is how a partition of
  ``AddPartitionsResponse`` says it was added), so the stripped example would show an
  answer no service sends, missing fields its own schema marks required.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_fields_from_routes
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

#: What a ``servers`` entry holds: its ``url`` and a ``description`` saying which process.
Server = dict[str, str]

#: The relative entry every document starts with: the service that served the document.
THIS_SERVICE: Server = {"url": "/", "description": "The service that serves this document."}


def install_document(app: FastAPI, servers: Iterable[Server]) -> None:
    """Make ``app.openapi()`` (hence ``/openapi.json``) list ``servers`` after the relative
    entry and keep the ``null`` values of its models' examples."""
    app.servers = [THIS_SERVICE, *servers]
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()  # cached by FastAPI until the routes change
        restore_example_nulls(document, _models(app))
        return document

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented hook


def restore_example_nulls(document: dict[str, Any], models: Iterable[type[BaseModel]]) -> None:
    """Put each model's own examples back into its component schema, in place.

    A schema is matched to a model by its title, and its examples are replaced only when
    they are the model's with the ``null`` values dropped: only what the encoder removed
    is restored, and a schema that merely shares a title is left as it was. Running it
    twice changes nothing.
    """
    by_title: dict[str, list[Any]] = {}
    for model in models:
        extra = model.model_config.get("json_schema_extra")
        found = extra.get("examples") if isinstance(extra, dict) else None
        if isinstance(found, list) and found:
            title = model.model_config.get("title") or model.__name__
            by_title[title] = to_jsonable_python(found)
    for schema in document.get("components", {}).get("schemas", {}).values():
        written = by_title.get(schema.get("title", ""))
        shown = schema.get("examples")
        if written is not None and shown is not None and _without_nulls(written) == shown:
            schema["examples"] = written


def _without_nulls(value: Any) -> Any:
    """``value`` as FastAPI's encoder leaves it: every ``null`` member of an object gone."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _models(app: FastAPI) -> list[type[BaseModel]]:
    """Every pydantic model the documented routes take or answer, nested ones included."""
    found: dict[type[BaseModel], None] = {}
    for field in get_fields_from_routes(app.routes):
        for model in _models_in(field.field_info.annotation):
            found.setdefault(model)
    return list(found)


def _models_in(
    annotation: Any, seen: set[type[BaseModel]] | None = None
) -> Iterator[type[BaseModel]]:
    """The models in a type: itself, its fields' and those inside ``list[...]``,
    ``X | None``, ``Annotated[...]`` and the like (whose arguments ``get_args`` gives)."""
    seen = set() if seen is None else seen
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in seen:
            seen.add(annotation)
            yield annotation
            for field in annotation.model_fields.values():
                yield from _models_in(field.annotation, seen)
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg, seen)


__all__ = ["THIS_SERVICE", "Server", "install_document", "restore_example_nulls"]
