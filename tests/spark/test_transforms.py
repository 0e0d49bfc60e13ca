"""The pieces that need no cluster: transforms by name, the sample's enrichment and
routing, the checker's arithmetic, the writer's deterministic batches and the task
reader's decoding of fetch answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sdk import ConsumerRecord
from spark_jobs._wire import records_below
from spark_jobs.check import compare
from spark_jobs.datasource.task_write import cut_batches
from spark_jobs.examples import events
from spark_jobs.reader import records_of
from spark_jobs.transforms import OutputRecord, build_transform, parse_options
from spark_jobs.writer import WriteOptions

pytestmark = pytest.mark.unit


def _record(value: str, offset: int = 7) -> ConsumerRecord:
    return ConsumerRecord("events", 1, offset, "k", value, {}, 0)


def test_a_transform_is_built_from_its_name_and_options() -> None:
    options = parse_options(["enriched=a", "dead_letter=b"])
    made = build_transform("spark_jobs.examples.events:record_transform", options)
    (out,) = made(_record(events.sample_event(0)))
    assert out.topic == "a"
    with pytest.raises(ValueError):
        build_transform("no-colon", {})
    with pytest.raises(ValueError):
        parse_options(["novalue"])


def test_the_sample_enriches_good_events_and_routes_bad_ones() -> None:
    good = events.enrich(_record(events.sample_event(3)), "ok", "dead")
    body = json.loads(str(good.value))
    assert good == OutputRecord("ok", good.value, "u3")
    assert body["country"] == "JP" and body["tier"] == "gold"
    assert body["amount_band"] in ("small", "medium", "large")
    assert body["source"] == "events-1@7"
    for i in (5, 11, 13):
        bad = events.enrich(_record(events.sample_event(i)), "ok", "dead")
        assert bad.topic == "dead" and json.loads(str(bad.value))["source"] == "events-1@7"


def test_compare_counts_duplicates_losses_and_strangers() -> None:
    assert compare(["a", "b"], ["b", "a"]).ok
    report = compare(["a", "b", "c"], ["a", "a", "b", "x"])
    assert report.duplicates == {"a": 2} and report.lost == ["c"] and report.unexpected == ["x"]
    assert "NOT exactly once" in str(report)


def test_batches_are_cut_the_same_way_every_time() -> None:
    records = [{"key": f"k{i}", "value": "x" * (i % 50)} for i in range(500)]
    options = WriteOptions(batch_records=40, batch_bytes=2000)
    cuts = [
        [len(b) for b in cut_batches(records, options.batch_records, options.batch_bytes)]
        for _ in range(2)
    ]
    assert cuts[0] == cuts[1] and sum(cuts[0]) == 500 and max(cuts[0]) <= 40


def test_fetch_answers_decode_into_consumer_records() -> None:
    """Text answers take the one-pass path, an answer with a base64 record the other;
    both give the records a consumer gives (bytes for base64), cut at the range's end."""
    raw: list[dict[str, Any]] = [
        {"offset": i, "key": f"k{i}", "value": f"v{i}", "headers": {"h": "1"} if i == 3 else {},
         "timestamp_ms": 1000 + i, "encoding": "utf8"}
        for i in range(10)
    ]
    expected = [
        ConsumerRecord("t", 2, i, f"k{i}", f"v{i}", {"h": "1"} if i == 3 else {}, 1000 + i)
        for i in range(10)
    ]
    assert records_of("t", 2, records_below(raw, 100)) == expected
    assert records_of("t", 2, records_below(raw, 4)) == expected[:4]
    binary: dict[str, Any] = {
        "offset": 10, "key": None, "value": "AP8=", "headers": {}, "timestamp_ms": 7,
        "encoding": "base64",
    }
    mixed = records_of("t", 2, records_below([*raw, binary], 100))
    assert mixed == [*expected, ConsumerRecord("t", 2, 10, None, b"\x00\xff", {}, 7)]
