"""The SDK hot-path figures of ``eos bench``: their rows in the table, on a small fake
result (the benchmark itself is not run here)."""

from __future__ import annotations

from typing import Any

import pytest

from eos_bench.bench_sdk_hot import hot_rows
from eos_bench.suite_report import table

pytestmark = pytest.mark.unit


def fake_hot() -> dict[str, Any]:
    def rate(n: int) -> dict[str, Any]:
        return {"name": "x", "records_per_s": n, "rounds": [n]}

    return {
        "node_limit": rate(400_000),
        "send": {**rate(80_000), "vs_node_limit": 0.2},
        "send_many": {**rate(300_000), "vs_node_limit": 0.75},
        "consumer": rate(350_000),
        "txn_ratio_1kb_100ms": {"rounds": 5, "median_ratio": 0.971, "ratios": [0.971] * 5},
    }


def test_hot_rows_in_order_with_their_limit() -> None:
    rows = hot_rows(fake_hot())
    assert [label.split(",")[0].strip() for label, _, _ in rows] == [
        "sdk Producer.send", "sdk Producer.send_many", "sdk Consumer read_committed",
        "limit: node accept", "sdk txn/idempotent"]
    assert rows[1][1:] == ("300,000", 0.75)
    assert rows[-1][1] == "0.971" and "median of 5" in rows[-1][0]
    assert hot_rows({}) == []


def test_the_table_shows_them_after_the_sdk_figures() -> None:
    def r(rate: int) -> dict[str, object]:
        return {"name": "x", "records_per_s": rate, "mb_per_s": 1.0, "transactions": 0,
                "commit_ms": 0.0, "records_per_txn": None, "cost_vs_idempotent": None}

    text = table({"sdk": {"raw_httpx": r(1000), "idempotent": r(800), "transactional": [],
                          "hot": fake_hot()}})
    assert "sdk Producer.send_many, 100 B (rec/s)" in text and "300,000" in text
    assert " 75.0%" in text and "0.971" in text
    assert text.index("raw httpx") < text.index("Producer.send_many")
