"""Hypothesis stateful test: random produce / retry / marker / fence / restart sequences
against a simple model; every step both isolation levels must read exactly what the model
says, and the high watermark and LSO must match it."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partition_service.log.engine import PartitionEngine
from partition_service.log.log import LogConfig
from tests.partition.engine_support import marker, open_engine, produce, values

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128)
IDEMPOTENT = [1, 2]
TRANSACTIONAL = [10, 11]


@dataclass
class Record:
    value: str
    pid: int | None = None  # transactional producer, if any
    txn: int = 0  # which transaction of that producer


@dataclass
class ProducerModel:
    epoch: int = 0
    next_seq: int = 0
    last_batch: tuple[int, list[str]] | None = None  # (base seq, values)
    open_txn_first: int | None = None
    txn: int = 0
    outcomes: dict[int, str] = field(default_factory=dict)  # txn -> COMMIT/ABORT
    known: bool = False  # the partition holds state for this producer


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="eos-stateful-"))
        self.engine: PartitionEngine = open_engine(self.root / "p", CONFIG)
        self.records: list[Record | None] = []  # None: a control record
        self.producers = {pid: ProducerModel() for pid in IDEMPOTENT + TRANSACTIONAL}
        self.counter = 0

    def teardown(self) -> None:
        self.engine.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _values(self, n: int) -> list[str]:
        out = [f"v{self.counter + i}" for i in range(n)]
        self.counter += n
        return out

    @rule(n=st.integers(1, 4))
    def produce_plain(self, n: int) -> None:
        vals = self._values(n)
        produce(self.engine, vals)
        self.records.extend(Record(v) for v in vals)

    @rule(pid=st.sampled_from(IDEMPOTENT), n=st.integers(1, 4))
    def produce_idempotent(self, pid: int, n: int) -> None:
        model = self.producers[pid]
        vals = self._values(n)
        result = produce(self.engine, vals, pid=pid, epoch=model.epoch, seq=model.next_seq)
        assert not result.duplicate
        model.last_batch = (model.next_seq, vals)
        model.next_seq += n
        model.known = True
        self.records.extend(Record(v) for v in vals)

    @rule(pid=st.sampled_from(IDEMPOTENT + TRANSACTIONAL))
    def retry_last_batch(self, pid: int) -> None:
        model = self.producers[pid]
        if model.last_batch is None:
            return
        end = self.engine.log_end_offset
        seq, vals = model.last_batch
        result = produce(
            self.engine, vals, pid=pid, epoch=model.epoch, seq=seq, txn=pid in TRANSACTIONAL
        )
        assert result.duplicate
        assert self.engine.log_end_offset == end

    @rule(pid=st.sampled_from(TRANSACTIONAL), n=st.integers(1, 3))
    def produce_transactional(self, pid: int, n: int) -> None:
        model = self.producers[pid]
        vals = self._values(n)
        if model.open_txn_first is None:
            model.open_txn_first = len(self.records)
            model.txn += 1
        produce(self.engine, vals, pid=pid, epoch=model.epoch, seq=model.next_seq, txn=True)
        model.last_batch = (model.next_seq, vals)
        model.next_seq += n
        model.known = True
        self.records.extend(Record(v, pid, model.txn) for v in vals)

    @rule(pid=st.sampled_from(TRANSACTIONAL), commit=st.booleans())
    def end_transaction(self, pid: int, commit: bool) -> None:
        model = self.producers[pid]
        result = "COMMIT" if commit else "ABORT"
        end = self.engine.log_end_offset
        marker(self.engine, pid, model.epoch, result)
        if model.open_txn_first is None:
            if model.known:
                assert self.engine.log_end_offset == end, "a repeated marker writes nothing"
            else:
                model.known = True  # the first marker records the producer here
                self.records.append(None)
            return
        model.outcomes[model.txn] = result
        model.open_txn_first = None
        self.records.append(None)

    @rule(pid=st.sampled_from(TRANSACTIONAL))
    def fence(self, pid: int) -> None:
        """The coordinator bumps the epoch and aborts (init by a new instance, or timeout)."""
        model = self.producers[pid]
        marker(self.engine, pid, model.epoch + 1, "ABORT")
        if model.open_txn_first is not None:
            model.outcomes[model.txn] = "ABORT"
            model.open_txn_first = None
            self.records.append(None)
        else:
            self.records.append(None)  # the epoch bump is recorded by a control batch
        model.known = True
        model.epoch += 1
        model.next_seq = 0
        model.last_batch = None

    @rule(checkpoint=st.booleans())
    def restart(self, checkpoint: bool) -> None:
        if checkpoint:
            self.engine.write_checkpoint(self.engine.capture_checkpoint())
        self.engine.close()
        self.engine = open_engine(self.root / "p", CONFIG)

    @precondition(lambda self: self.engine.log_end_offset > 0)
    @rule()
    def restart_without_index(self) -> None:
        self.engine.close()
        for index in (self.root / "p").glob("*.index"):
            index.unlink()
        self.engine = open_engine(self.root / "p", CONFIG)

    def _lso(self) -> int:
        opens = [m.open_txn_first for m in self.producers.values() if m.open_txn_first is not None]
        return min(opens) if opens else len(self.records)

    @invariant()
    def offsets_match_model(self) -> None:
        assert self.engine.high_watermark == len(self.records)
        assert self.engine.last_stable_offset == self._lso()

    @invariant()
    def reads_match_model(self) -> None:
        uncommitted = [r.value for r in self.records if r is not None]
        assert values(self.engine, committed=False) == uncommitted
        lso = self._lso()
        committed = [
            r.value
            for r in self.records[:lso]
            if r is not None
            and (r.pid is None or self.producers[r.pid].outcomes.get(r.txn) == "COMMIT")
        ]
        assert values(self.engine, committed=True) == committed


LogMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogMachine = pytest.mark.slow(LogMachine.TestCase)
