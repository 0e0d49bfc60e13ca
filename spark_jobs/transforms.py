"""What a pipeline's transform is, and how the job finds one by name.

Two kinds, both plain to write and to test without Spark:

* a **record transform**: ``(ConsumerRecord) -> iterable of OutputRecord``. It runs inside
  the executor task that owns the source partition, between the read_committed read and the
  transactional produce, so it sees records in offset order and each output record names
  its topic (routing is just returning another topic);
* a **DataFrame transform**: ``(DataFrame) -> DataFrame``. It gets the batch's records
  (columns of ``spark_jobs.reader.record_schema``) and returns rows with ``topic``,
  ``value`` and optionally ``key``, ``partition``, ``headers``, written atomically by
  ``spark_jobs.writer``.

On the command line a transform is named ``module:factory``; the factory is called with the
``--option key=value`` pairs and returns the transform, so one module can serve several
deployments (topic names, lookup tables) without code changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from sdk import ConsumerRecord

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class OutputRecord(NamedTuple):
    """One record a transform wants written. ``partition=None``: by key, as the SDK does."""

    topic: str
    value: str | bytes | None
    key: str | bytes | None = None
    partition: int | None = None
    headers: dict[str, str] | None = None


RecordTransform = Callable[[ConsumerRecord], Iterable[OutputRecord]]
DataFrameTransform = Callable[["DataFrame"], "DataFrame"]


def copy_to(topic: str) -> RecordTransform:
    """The identity transform: every record to ``topic``, same key, value and partition
    (what the benchmark copies)."""

    def copy(record: ConsumerRecord) -> Iterable[OutputRecord]:
        return (OutputRecord(topic, record.value, record.key, record.partition, None),)

    return copy


def load_factory(spec: str) -> Callable[..., Any]:
    """``package.module:name`` -> the object ``name`` of that module."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a transform is named module:factory, not {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``."""
    options: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"an option is key=value, not {pair!r}")
        options[name.strip()] = value
    return options


def build_transform(spec: str, options: dict[str, str]) -> Callable[..., Any]:
    """Call the factory named by ``spec`` with ``options``; the result is the transform."""
    transform = load_factory(spec)(**options)
    if not callable(transform):
        raise TypeError(f"{spec}(...) returned {type(transform).__name__}, not a transform")
    return transform  # type: ignore[no-any-return]
