"""The replication protocol in one process, driven by Hypothesis against a simple model.

Three replicas, each a real ``PartitionEngine`` on its own directory, a controller that
elects only from the ISR, the leader's ``LeaderReplicas`` bookkeeping and the follower's
steps (``partition_service.replication.follower``) — the same code the nodes run, minus
the HTTP. Hypothesis interleaves produces, follower fetches, ISR changes, crashes (leader
or follower), restarts, and the loss of a replica's whole disk. After every step:

* **nothing acknowledged is lost**: every record acknowledged with acks=all (the high
  watermark passed it while at least ``min_insync_replicas`` were in sync) is in the
  current leader's log at the offset it was acknowledged at;
* **no divergence**: every live follower's log is, byte for byte, a prefix of the leader's
  (a follower cuts its log by leader epoch before it copies from a new leader);
* **the high watermark is honest**: no ISR member's log ends below it.

``test_the_model_catches_a_follower_that_does_not_truncate`` plants the bug the epoch
exchange exists for (a returning replica that keeps its old suffix) and shows the checks
catch it.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partition_service.log import batch as frames
from partition_service.log.engine import PartitionEngine
from partition_service.log.log import LogConfig
from partition_service.replication import follower as steps
from partition_service.replication.isr import LeaderReplicas

REPLICAS = [1, 2, 3]
MIN_ISR = 2
LAG_MS = 1000
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)
NOW = 1_700_000_000_000


@dataclass
class Acked:
    offset: int
    value: str


class ReplicatedPartition(RuleBasedStateMachine):
    """The cluster of three replicas, and what the model expects of it."""

    truncate_followers = True  # the planted-bug test turns this off

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="eos-replication-model-"))
        self.engines: dict[int, PartitionEngine | None] = {}
        for r in REPLICAS:
            self.engines[r] = self._open(r)
        self.now = NOW
        self.epoch = 0
        self.leader: int | None = 1
        self.isr = list(REPLICAS)
        self.acked: list[Acked] = []
        self.pending: list[tuple[int, int, list[str]]] = []  # (base, last, values)
        self.counter = 0
        self.state = self._lead(1)
        for r in REPLICAS[1:]:
            self._follow(r)

    # -- the cluster's plumbing ----------------------------------------------------------
    def _open(self, replica: int) -> PartitionEngine:
        engine = PartitionEngine(self.root / str(replica), "t", 0, CONFIG)
        engine.open()
        engine.replicated_offset = engine.durable_offset  # a follower until told otherwise
        return engine

    def _engine(self, replica: int) -> PartitionEngine:
        engine = self.engines[replica]
        assert engine is not None, f"replica {replica} is down"
        return engine

    def _alive(self) -> list[int]:
        return [r for r in REPLICAS if self.engines[r] is not None]

    def _lead(self, replica: int) -> LeaderReplicas:
        engine = self._engine(replica)
        engine.become_leader(self.epoch)
        state = LeaderReplicas(
            leader=replica, leader_epoch=self.epoch, partition_epoch=0, replicas=REPLICAS,
            isr=self.isr, min_insync_replicas=MIN_ISR,
            epoch_start_offset=engine.log_end_offset, lag_time_ms=LAG_MS, now_ms=self.now,
            high_watermark=engine.high_watermark,
        )  # fmt: skip
        engine.replicated_offset = state.high_watermark
        return state

    def _follow(self, replica: int) -> None:
        """What a replica does when it starts following the current leader: ask where its
        latest epoch ended there and cut its log (KIP-101)."""
        if self.leader is None or not self.truncate_followers:
            return
        engine = self._engine(replica)
        leader = self._engine(self.leader)
        epoch, end = leader.end_offset_for(engine.epochs.latest_epoch)
        steps.truncate_for_leader(engine, epoch, end)

    def _advance(self) -> None:
        """The leader's high watermark, and the acknowledgements it releases."""
        if self.leader is None:
            return
        leader = self._engine(self.leader)
        hw = self.state.advance_high_watermark(leader.durable_offset)
        leader.replicated_offset = hw
        still = []
        for base, last, values in self.pending:
            if last >= hw:
                still.append((base, last, values))
            elif self.state.enough_in_sync():
                self.acked += [Acked(base + i, v) for i, v in enumerate(values)]
            # else NOT_ENOUGH_REPLICAS_AFTER_APPEND: the ISR shrank while it waited
        self.pending = still

    def _elect(self) -> None:
        """The controller: the first live ISR member in replica order, in a new epoch."""
        alive = set(self._alive())
        self.isr = [r for r in self.isr if r in alive] or self.isr
        candidates = [r for r in REPLICAS if r in self.isr and r in alive]
        if not candidates:
            self.leader = None
            return
        self.epoch += 1
        self.leader = candidates[0]
        self.pending = []  # a deposed leader never answers what it was waiting for
        self.state = self._lead(self.leader)
        for r in self._alive():
            if r != self.leader:
                self._follow(r)

    # -- rules ---------------------------------------------------------------------------
    @precondition(lambda self: self.leader is not None)
    @rule(count=st.integers(1, 4), idempotent=st.booleans())
    def produce(self, count: int, idempotent: bool) -> None:
        """acks=all: refused (NOT_ENOUGH_REPLICAS) with too small an ISR, else written and
        acknowledged once the high watermark passes it."""
        if not self.state.enough_in_sync():
            return
        assert self.leader is not None
        leader = self._engine(self.leader)
        values = [f"v{self.counter + i}" for i in range(count)]
        self.counter += count
        rows = [(None, v, None, NOW) for v in values]
        result = leader.append_data(rows, now_ms=NOW)
        leader.mark_durable(leader.log_end_offset)
        self.pending.append((result.base_offset, result.last_offset, values))
        self._advance()

    @precondition(lambda self: self.leader is not None)
    @rule(replica=st.sampled_from(REPLICAS), max_bytes=st.sampled_from([1, 200, 4096]))
    def fetch(self, replica: int, max_bytes: int) -> None:
        """A live follower fetches once from its log end."""
        if replica == self.leader or self.engines[replica] is None:
            return
        assert self.leader is not None
        engine, leader = self._engine(replica), self._engine(self.leader)
        self.state.on_fetch(replica, engine.log_end_offset, leader.log_end_offset, self.now)
        self._advance()
        data = leader.read_frames(engine.log_end_offset, max_bytes)
        steps.apply_fetched(engine, data, self.state.high_watermark)
        engine.mark_durable(engine.log_end_offset)

    @precondition(lambda self: self.leader is not None)
    @rule(ms=st.sampled_from([100, 600, 1500]))
    def time_passes_and_isr_changes(self, ms: int) -> None:
        """The clock moves; the leader proposes the ISR it sees and the controller takes
        it (only members that are alive join)."""
        self.now += ms
        proposal = self.state.proposed_isr(self.now)
        if proposal is None:
            return
        alive = set(self._alive())
        proposal = [r for r in proposal if r in alive or r in self.isr]
        self.isr = proposal
        self.state.accept_state(proposal, self.state.partition_epoch + 1, MIN_ISR)
        self._advance()

    @rule(replica=st.sampled_from(REPLICAS))
    def crash(self, replica: int) -> None:
        engine = self.engines[replica]
        if engine is None:
            return
        engine.close()
        self.engines[replica] = None
        if replica == self.leader:
            self._elect()
        elif replica in self.isr and len(self.isr) > 1:
            self.isr = [r for r in self.isr if r != replica]  # the controller sees it dead
            if self.leader is not None:
                self.state.accept_state(self.isr, self.state.partition_epoch + 1, MIN_ISR)
                self._advance()

    @rule(replica=st.sampled_from(REPLICAS), wipe=st.booleans())
    def restart(self, replica: int, wipe: bool) -> None:
        """A replica comes back, with its disk or an empty one, as a follower."""
        if self.engines[replica] is not None:
            return
        if wipe:
            # A replica whose disk is gone is in sync with nothing: it leaves the ISR even
            # as its last member (then no clean leader is left).
            shutil.rmtree(self.root / str(replica), ignore_errors=True)
            self.isr = [r for r in self.isr if r != replica]
        self.engines[replica] = self._open(replica)
        if self.leader is None:
            if replica in self.isr:  # the last in-sync replica is back: it leads again
                self._elect()
            return
        self._follow(replica)
        self.state.followers[replica].log_end_offset = self._engine(replica).log_end_offset

    # -- what must always hold -----------------------------------------------------------
    @invariant()
    def nothing_acknowledged_is_lost(self) -> None:
        if self.leader is None or not self.acked:
            return
        leader = self._engine(self.leader)
        seen: dict[int, str] = {}
        for record in _records(leader, self.acked[0].offset):
            seen[record[0]] = record[1]
        for acked in self.acked:
            assert seen.get(acked.offset) == acked.value, (acked, self.leader, self.epoch)

    @invariant()
    def followers_never_diverge(self) -> None:
        if self.leader is None:
            return
        leader_log = _log_bytes(self._engine(self.leader))
        for r in self._alive():
            if r != self.leader:
                assert leader_log.startswith(_log_bytes(self._engine(r))), (
                    f"replica {r} diverges from leader {self.leader} in epoch {self.epoch}"
                )

    @invariant()
    def high_watermark_is_in_every_isr_log(self) -> None:
        if self.leader is None:
            return
        hw = self.state.high_watermark
        for r in self.isr:
            engine = self.engines[r]
            if engine is not None:
                assert engine.log_end_offset >= hw, (r, engine.log_end_offset, hw)

    def teardown(self) -> None:
        for engine in self.engines.values():
            if engine is not None:
                engine.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _log_bytes(engine: PartitionEngine) -> bytes:
    return engine.read_frames(engine.log_start_offset, 1 << 30)


def _records(engine: PartitionEngine, start: int) -> list[tuple[int, str]]:
    """(offset, value) of every data record of the local log from ``start``, the part
    above the high watermark included."""
    out: list[tuple[int, str]] = []
    for header, view, position in engine.log.batches_from(start):
        if not header.is_control:
            rows = frames.payload_of(view, position, header)
            out += [(header.base_offset + i, str(row[1])) for i, row in enumerate(rows)]
    return out


MODEL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
def test_replication_keeps_every_acknowledged_record_and_never_diverges() -> None:
    ReplicatedPartition.TestCase.settings = MODEL_SETTINGS
    ReplicatedPartition.TestCase().runTest()


class WithoutTruncation(ReplicatedPartition):
    truncate_followers = False


@pytest.mark.slow
def test_the_model_catches_a_follower_that_does_not_truncate() -> None:
    # the first failing run proves the point: shrinking it (most of the time otherwise)
    # is left out; derandomized, the search is the same every run (a random one missed
    # the planted bug in 300 examples now and then)
    WithoutTruncation.TestCase.settings = settings(
        MODEL_SETTINGS, max_examples=300, phases=[Phase.explicit, Phase.generate],
        derandomize=True,
    )
    with pytest.raises(AssertionError, match=r"diverges|Acked"):
        WithoutTruncation.TestCase().runTest()
