"""Numbered batches of many partitions sent together: one request per leader node.

A Spark task that writes to many partitions ends with a partial batch on each of them,
and a sorted write has a batch of every partition at each step: one request per batch
costs a round trip and the node's per-request work each, so a task writing to a hundred
partitions spent most of its last half second waiting for them one by one. Here the
batches go as one ``POST /v1/produce`` per leader node (``eos_protocol.produce_many``),
each answered on its own, with the retry rule of the single produce
(``SequencedPartitionWriter.produce``) applied to each batch: a resend keeps its
sequence, so it can only ever be a duplicate. A batch alone for its node, or for a node of
an earlier release (404 to the path), goes to its partition's own path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eos_protocol.common import read_answer
from eos_protocol.errors import InternalError, NotFoundError
from eos_protocol.node import ProduceResponse
from sdk._metadata import PRODUCE_MANY_PATH
from sdk._transport import (
    POLICIES,
    UNKNOWN_OUTCOME,
    Req,
    Verdict,
    backoff_s,
    classify,
    error_from_body,
)
from sdk._types import TopicPartition
from spark_jobs._wire import CALL_TIMEOUT_S, SequencedPartitionWriter

#: How long a node that answered 404 to the path is sent one batch per request.
SINGLE_BATCHES_FOR_S = 60.0


@dataclass(frozen=True)
class SequencedBatch:
    """One partition's batch at the sequence its writer chose (``produce``'s arguments)."""

    tp: TopicPartition
    base_sequence: int
    records: Sequence[dict[str, Any]]
    transactional: bool = True
    encoding: str = "utf8"
    slot: int | None = None


#: A batch's outcome: its answer, or the error it failed with for good.
Outcome = ProduceResponse | BaseException


class BatchesTogether:
    """Sends ``SequencedBatch`` lists through one writer, remembering the nodes that know
    no multi-partition produce."""

    def __init__(self, writer: SequencedPartitionWriter) -> None:
        self.writer = writer
        self._single_until: dict[str, float] = {}

    def send(self, batches: Sequence[SequencedBatch]) -> list[Outcome]:
        """Every batch's outcome, in order; a retriable error is retried (the batch and its
        sequence unchanged) until ``CALL_TIMEOUT_S``. At most one batch per partition."""
        outcomes: list[Outcome | None] = [None] * len(batches)
        pending = list(range(len(batches)))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        attempt = 0
        while pending:
            attempt += 1
            failures = self._round(batches, pending, outcomes)
            pending = []
            last: BaseException | None = None
            for index, exc in failures.items():
                verdict = classify(POLICIES[Req.PRODUCE], exc)
                if verdict is Verdict.FAIL or time.monotonic() >= deadline:
                    outcomes[index] = exc
                    continue
                if verdict is Verdict.REFIND or isinstance(exc, UNKNOWN_OUTCOME):
                    self.writer.metadata.invalidate_topic(batches[index].tp.topic)
                pending.append(index)
                last = exc
            if last is not None:
                time.sleep(backoff_s(last, attempt, self.writer.http.retry))
        return [o for o in outcomes if o is not None]

    def _round(
        self, batches: Sequence[SequencedBatch], pending: list[int], outcomes: list[Outcome | None]
    ) -> dict[int, BaseException]:
        """One attempt of every pending batch; the errors, by batch."""
        failures: dict[int, BaseException] = {}
        by_node: dict[str, list[int]] = {}
        for index in pending:
            try:
                by_node.setdefault(self.writer.leader(batches[index].tp), []).append(index)
            except Exception as exc:
                failures[index] = exc
        now = time.monotonic()
        for url, indexes in by_node.items():
            if len(indexes) > 1 and self._single_until.get(url, 0.0) <= now:
                try:
                    self._together(url, batches, indexes, outcomes, failures)
                    continue
                except NotFoundError:
                    # A node of an earlier release (nothing was written): its batches go
                    # one per request, these ones now.
                    self._single_until[url] = now + SINGLE_BATCHES_FOR_S
            for index in indexes:
                batch = batches[index]
                try:
                    outcomes[index] = self.writer.produce_once(
                        batch.tp, batch.base_sequence, batch.records,
                        transactional=batch.transactional, encoding=batch.encoding,
                        slot=batch.slot,
                    )  # fmt: skip
                except Exception as exc:
                    failures[index] = exc
        return failures

    def _together(
        self,
        url: str,
        batches: Sequence[SequencedBatch],
        indexes: list[int],
        outcomes: list[Outcome | None],
        failures: dict[int, BaseException],
    ) -> None:
        """One request for the batches ``indexes`` of the node at ``url``; each entry of
        its answer settles its batch. Raises ``NotFoundError`` if the node lacks the path."""
        try:
            answer = self.writer.http.send_once("POST", url + PRODUCE_MANY_PATH, json={
                "batches": [_entry(self.writer, batches[i]) for i in indexes]})  # fmt: skip
            entries = answer["batches"]
            if len(entries) != len(indexes):
                raise InternalError(f"{len(entries)} answers to {len(indexes)} batches")
        except NotFoundError:
            raise
        except Exception as exc:
            for index in indexes:
                failures[index] = exc
            return
        for index, entry in zip(indexes, entries, strict=True):
            error = entry.get("error")
            if error:
                failures[index] = error_from_body(error)
            else:
                outcomes[index] = read_answer(ProduceResponse, entry)


def _entry(writer: SequencedPartitionWriter, batch: SequencedBatch) -> dict[str, Any]:
    body = writer.produce_body(
        batch.base_sequence, batch.records, transactional=batch.transactional,
        encoding=batch.encoding, slot=batch.slot,
    )  # fmt: skip
    return {"topic": batch.tp.topic, "partition": batch.tp.partition, **body}
