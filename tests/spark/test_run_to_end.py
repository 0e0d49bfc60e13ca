"""The suite's restart of a streaming query that Spark failed before its first batch
(``tests.spark.helpers.run_to_end``): started again only for Spark's connect-back
timeout, only before any batch, and only so many times; anything else is raised."""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark.helpers import CONNECT_BACK, START_ATTEMPTS, run_to_end

pytestmark = pytest.mark.unit


class FakeQuery:
    """What ``run_to_end`` uses of a ``StreamingQuery``, failing as told."""

    def __init__(self, error: Exception | None, progress: list[dict[str, Any]]) -> None:
        self.error = error
        self.recentProgress = progress
        self.stopped = False

    def awaitTermination(self, _timeout: float) -> None:
        if self.error is not None:
            raise self.error

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


def _starts(*queries: FakeQuery) -> tuple[list[FakeQuery], Any]:
    started: list[FakeQuery] = []
    pending = list(queries)

    def start() -> FakeQuery:
        started.append(pending.pop(0))
        return started[-1]

    return started, start


def test_a_query_that_did_not_connect_back_is_started_again() -> None:
    late = RuntimeError(f"[STREAM_FAILED] {CONNECT_BACK}.")
    started, start = _starts(FakeQuery(late, []), FakeQuery(None, [{"batchId": 0}]))
    assert run_to_end(start) is started[1]
    assert [q.stopped for q in started] == [True, True]


def test_other_failures_and_failures_after_a_batch_are_raised() -> None:
    late = RuntimeError(CONNECT_BACK)
    for first in (FakeQuery(RuntimeError("boom"), []), FakeQuery(late, [{"batchId": 0}])):
        started, start = _starts(first, FakeQuery(None, []))
        with pytest.raises(AssertionError, match="the query failed"):
            run_to_end(start)
        assert started == [first]


def test_it_gives_up_after_so_many_starts() -> None:
    queries = [FakeQuery(RuntimeError(CONNECT_BACK), []) for _ in range(START_ATTEMPTS + 1)]
    started, start = _starts(*queries)
    with pytest.raises(AssertionError, match=CONNECT_BACK):
        run_to_end(start)
    assert len(started) == START_ATTEMPTS
