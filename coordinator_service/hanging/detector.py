"""The hanging-transaction detector: ask every node, compare, report, and act.

A pass asks every storage node for the transactions open on the partitions it leads
(``GET /internal/v1/open-transactions``), *then* reads the records of the transactional
ids holding those producer ids from the database, and classifies each open transaction
with the pure rule (``rule.classify``). The order matters: a batch that opened a
transaction on a node was verified against a record that was already durable (KIP-890),
so a record read afterwards is at least as new as the batch; a transaction it does not
know as Ongoing with that partition is not one still being added.

Which instance acts, with several coordinators sharing the log partitions:

* every instance runs the passes (they only read), so ``GET
  /v1/admin/hanging-transactions`` answers alike on each;
* a transaction whose producer id belongs to a transactional id is acted on only by the
  owner of that id's log partition, under the id's lock, with its lease's coordinator
  epoch on the marker — exactly the instance and the serialisation the id's own requests
  go through, so no add-partitions, commit or abort of that id can run between the last
  look and the marker (a COMMIT marker sent again must not close a newer transaction of
  the same epoch); a later owner's markers carry a newer epoch and prevail;
* a transaction whose producer id no record holds is acted on only by the controller
  (the holder of the controller lease, one instance at a time), and its abort is
  idempotent anyway: the marker names the bumped epoch, and a second one finds nothing
  open at an epoch below it and writes nothing.

Before it acts, the instance asks the partition's leader again and reclassifies with the
record as it is now: the pass's picture may be seconds old. Acting is only automatic with
``abort_hanging_after_ms`` set, for transactions open longer than that; without it the
detector only reports (the gauge ``eos_hanging_transactions``, on the controller only so
that a sum over instances counts each once, and the admin endpoint).

One bad entry never stops a pass: a node that is down or answers garbage, a partition
whose leader moved, a marker the node refuses — each is logged, counted in
``eos_coordinator_background_entries_set_aside_total{loop="hanging"}``, and the pass goes
on with the rest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_service.clock import Clock
from coordinator_service.controller.controller import Controller
from coordinator_service.controller.metadata import Metadata
from coordinator_service.db.engine import Database
from coordinator_service.db.schema import transactions
from coordinator_service.hanging.nodes import NodeCallFailed, NodeCalls
from coordinator_service.hanging.rule import (
    Action,
    Verdict,
    bumped,
    classify,
    manual_abort_refusal,
    producer_ids,
)
from coordinator_service.metrics import CoordinatorMetrics
from coordinator_service.transactions.lifecycle import TransactionCoordinator
from coordinator_service.transactions.state import TxnRecord
from coordinator_service.transactions.store import record_from_row
from eos_protocol.errors import (
    EosError,
    InvalidTxnStateError,
    LeaderNotAvailableError,
    NotFoundError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.hanging import (
    AbortHangingRequest,
    AbortHangingResponse,
    HangingTransaction,
    HangingTransactionsResponse,
    OpenTransaction,
)
from eos_protocol.node import MarkerResult
from eos_protocol.replication import NO_LEADER

log = logging.getLogger("eos.coordinator.hanging")

T = transactions


def records_for(conn: Connection, pids: list[int]) -> dict[int, TxnRecord]:
    """Producer id -> the record that speaks for it: as its current id first, then as the
    new id of a rollover, then as the previous one (a committed transaction's id after a
    version-2 rollover is the record's last one)."""
    if not pids:
        return {}
    rows = conn.execute(
        sa.select(T).where(
            sa.or_(T.c.producer_id.in_(pids), T.c.next_producer_id.in_(pids),
                   T.c.last_producer_id.in_(pids))
        )
    )  # fmt: skip
    wanted = set(pids)
    found: dict[int, tuple[int, TxnRecord]] = {}
    for row in rows:
        rec = record_from_row(row)
        for rank, pid in enumerate((rec.producer_id, rec.next_producer_id, rec.last_producer_id)):
            if pid in wanted and (pid not in found or rank < found[pid][0]):
                found[pid] = (rank, rec)
    return {pid: rec for pid, (_, rec) in found.items()}


@dataclass(frozen=True)
class Finding:
    """One hanging transaction: where it is open, and what the rule says."""

    txn: OpenTransaction
    node_id: int
    verdict: Verdict
    record: TxnRecord | None

    def describe(self) -> HangingTransaction:
        assert self.verdict.reason is not None
        state = self.verdict.coordinator_state
        return HangingTransaction(
            topic=self.txn.topic, partition=self.txn.partition,
            producer_id=self.txn.producer_id, producer_epoch=self.txn.producer_epoch,
            first_offset=self.txn.first_offset, age_ms=self.txn.age_ms,
            reason=self.verdict.reason, transactional_id=self.verdict.transactional_id,
            coordinator_state=None if state is None else state.value,
        )  # fmt: skip


@dataclass(frozen=True)
class DetectionPass:
    checked_at_ms: int
    open_on_nodes: int
    findings: list[Finding]
    failed_nodes: list[int]

    def report(self) -> HangingTransactionsResponse:
        return HangingTransactionsResponse(
            checked_at_ms=self.checked_at_ms, open_on_nodes=self.open_on_nodes,
            hanging=[f.describe() for f in self.findings],
        )  # fmt: skip


class HangingDetector:
    def __init__(
        self,
        *,
        db: Database,
        coordinator: TransactionCoordinator,
        metadata: Metadata,
        controller: Controller,
        calls: NodeCalls,
        clock: Clock,
        metrics: CoordinatorMetrics,
        max_timeout_ms: int,
        margin_ms: int,
        abort_after_ms: int | None,
        interval_ms: int,
    ) -> None:
        self._db = db
        self.coordinator = coordinator
        self._metadata = metadata
        self._controller = controller
        self.calls = calls
        self._clock = clock
        self._metrics = metrics
        self._max_timeout_ms = max_timeout_ms
        self._margin_ms = margin_ms
        self.abort_after_ms = abort_after_ms
        self._interval_s = interval_ms / 1000

    def classify(self, txn: OpenTransaction, rec: TxnRecord | None) -> Verdict:
        return classify(
            txn, rec, now_ms=self._clock.now_ms(), max_timeout_ms=self._max_timeout_ms,
            margin_ms=self._margin_ms,
        )  # fmt: skip

    # --- looking -------------------------------------------------------------------------

    async def detect(self) -> DetectionPass:
        """One look at every node (read only): the open transactions and the hanging ones."""
        checked_at = self._clock.now_ms()
        node_ids = self.calls.node_ids
        answers = await asyncio.gather(*(self._ask(n) for n in node_ids))
        failed = [n for n, found in zip(node_ids, answers, strict=True) if found is None]
        opened: list[tuple[int, OpenTransaction]] = []
        for node_id, found in zip(node_ids, answers, strict=True):
            for txn in found or ():
                if self._led_elsewhere(node_id, txn):
                    continue
                opened.append((node_id, txn))
        pids = sorted({txn.producer_id for _, txn in opened})
        records = await self._db.run(records_for, pids)
        findings = []
        for node_id, txn in opened:
            rec = records.get(txn.producer_id)
            verdict = self.classify(txn, rec)
            if verdict.hanging:
                findings.append(Finding(txn, node_id, verdict, rec))
        return DetectionPass(checked_at, len(opened), findings, failed)

    async def _ask(self, node_id: int) -> list[OpenTransaction] | None:
        try:
            return (await self.calls.open_transactions(node_id)).open_transactions
        except NodeCallFailed as exc:
            self._set_aside(f"open transactions of node {node_id} not read: {exc}")
            return None

    def _led_elsewhere(self, node_id: int, txn: OpenTransaction) -> bool:
        """A node that still thinks it leads a partition the metadata gives to another
        (a leader moved, the old one has not heard yet): its picture is not the log's."""
        leader = self._metadata.cached_leader(txn.topic, txn.partition)
        if leader is None or leader == node_id:
            return False
        log.info("open transaction of producer %d on %s/%d reported by node %d, but node "
                 "%s leads it now; left for the next pass", txn.producer_id, txn.topic,
                 txn.partition, node_id, leader)
        return True

    def _set_aside(self, message: str) -> None:
        self._metrics.set_aside.labels(loop="hanging").inc()
        log.warning("hanging-transaction detector: %s; going on with the rest", message)

    # --- acting --------------------------------------------------------------------------

    async def run_once(self) -> DetectionPass:
        """A pass, the gauge, and (with ``abort_hanging_after_ms``) the due actions."""
        found = await self.detect()
        controller = self._controller.epoch is not None
        self._metrics.hanging_transactions.set(len(found.findings) if controller else 0)
        if self.abort_after_ms is None:
            return found
        for finding in found.findings:
            if finding.txn.age_ms < self.abort_after_ms or finding.verdict.action is Action.NONE:
                continue
            if finding.record is None and not controller:
                continue  # the controller acts on producers no record holds
            try:
                await self.act(finding)
            except (NodeCallFailed, EosError) as exc:
                self._set_aside(f"{_name(finding.txn)} not resolved: {exc}")
            except Exception:  # a bug on one entry's data: the others still go
                log.exception("acting on %s failed", _name(finding.txn))
                self._metrics.set_aside.labels(loop="hanging").inc()
        return found

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.run_once()
            except Exception:  # the database may be away for a while: next pass
                log.exception("hanging-transaction pass failed")

    async def act(self, finding: Finding) -> str | None:
        """Resolve one hanging transaction as its verdict says, after a fresh look; the
        action taken (None: nothing, it was no longer due or is not this instance's)."""
        rec = finding.record
        if rec is None:
            return await self._resolve(finding.txn, None, coordinator_epoch=None)
        tid = rec.transactional_id
        assert self.coordinator.leases is not None
        token = self.coordinator.leases.live_token(self.coordinator.partition_of(tid))
        if token is None:
            return None  # the owner of the id acts
        if finding.verdict.action is Action.COORDINATOR_ABORT:
            # what the expiry scan does, rechecked under the id's lock
            if await self.coordinator.abort_timed_out(tid, self._clock.now_ms()):
                return self._done(finding.txn, Action.COORDINATOR_ABORT.value, tid)
            return None
        # The id's lock: none of its requests runs between the fresh look and the marker.
        async with self.coordinator._lock(tid):
            current = self.coordinator.cache.get(token.log_partition, {}).get(tid)
            return await self._resolve(
                finding.txn, current, coordinator_epoch=token.coordinator_epoch
            )

    async def _resolve(
        self, seen: OpenTransaction, rec: TxnRecord | None, *, coordinator_epoch: int | None
    ) -> str | None:
        leader = await self.current_leader(seen.topic, seen.partition)
        txn = await self.calls.open_on(leader, seen.topic, seen.partition, seen.producer_id)
        if txn is None or txn.producer_epoch != seen.producer_epoch:
            return None  # ended meanwhile
        if rec is None:
            rec = (await self._db.run(records_for, [txn.producer_id])).get(txn.producer_id)
            if rec is not None:
                return None  # a record appeared meanwhile: its owner decides next pass
        elif txn.producer_id not in producer_ids(rec):
            return None
        verdict = self.classify(txn, rec)
        if verdict.action is Action.RESUME_MARKERS and rec is not None:
            if self.coordinator.ensure_markers(rec) is None:
                return None
            return self._done(txn, Action.RESUME_MARKERS.value, rec.transactional_id)
        if verdict.action is not Action.MARKER or verdict.marker is None:
            return None
        assert verdict.marker_epoch is not None
        # the owner's lease epoch (a stale owner is fenced by the node), or for a producer
        # no record holds the newest the node has seen for it
        epoch = coordinator_epoch if coordinator_epoch is not None else txn.coordinator_epoch
        await self.write(leader, txn, verdict.marker, verdict.marker_epoch, epoch)
        return self._done(txn, verdict.marker.value.lower(), verdict.transactional_id)

    async def current_leader(self, topic: str, partition: int) -> int:
        """The partition's leader by the metadata; raises if none can be named now."""
        leader = await self._metadata.leader(topic, partition)
        if leader is None or leader == NO_LEADER:
            raise NodeCallFailed(f"{topic}/{partition} has no leader now")
        return leader

    async def write(
        self,
        leader: int,
        txn: OpenTransaction,
        result: MarkerResult,
        marker_epoch: int,
        coordinator_epoch: int,
    ) -> None:
        """One marker on the leader (it replicates to the followers like any marker)."""
        error = await self.calls.write_marker(
            leader, txn, result, marker_epoch, coordinator_epoch
        )
        if error is not None:
            if error in ("NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE"):
                self._metadata.request_refresh()
            raise NodeCallFailed(f"node {leader} refused the {result.value} marker: {error}")

    # --- an operator's abort ---------------------------------------------------------------

    async def abort_requested(self, request: AbortHangingRequest) -> AbortHangingResponse:
        """``POST /v1/admin/hanging-transactions/abort``: an ABORT marker at the bumped
        epoch on the partition's leader, after the same checks as the detector's own
        (refused, changing nothing, when the batches are or may be committed data, or when
        the coordinator holds the transaction and ends it through its transactional id)."""
        topic, partition = request.topic, request.partition
        leader = await self._metadata.leader(topic, partition)
        if leader is None:
            raise UnknownTopicOrPartitionError(f"{topic}/{partition} is not a known partition")
        if leader == NO_LEADER:
            raise LeaderNotAvailableError(f"{topic}/{partition} has no live leader now")
        try:
            txn = await self.calls.open_on(leader, topic, partition, request.producer_id)
        except NodeCallFailed as exc:
            raise LeaderNotAvailableError(f"the leader of {topic}/{partition}: {exc}") from exc
        if txn is None or txn.producer_epoch != request.producer_epoch:
            raise NotFoundError(
                f"no transaction of producer {request.producer_id} epoch "
                f"{request.producer_epoch} is open on {topic}/{partition}"
            )
        rec = (await self._db.run(records_for, [txn.producer_id])).get(txn.producer_id)
        token = None
        if rec is not None:
            assert self.coordinator.leases is not None
            token = self.coordinator.leases.live_token(
                self.coordinator.partition_of(rec.transactional_id)
            )
        if token is None or rec is None:
            return await self._abort_checked(leader, txn, rec, txn.coordinator_epoch)
        async with self.coordinator._lock(rec.transactional_id):
            current = self.coordinator.cache.get(token.log_partition, {}).get(
                rec.transactional_id, rec
            )
            return await self._abort_checked(leader, txn, current, token.coordinator_epoch)

    async def _abort_checked(
        self, leader: int, txn: OpenTransaction, rec: TxnRecord | None, coordinator_epoch: int
    ) -> AbortHangingResponse:
        refusal = manual_abort_refusal(self.classify(txn, rec))
        if refusal is not None:
            raise InvalidTxnStateError(
                f"producer {txn.producer_id} epoch {txn.producer_epoch} on "
                f"{txn.topic}/{txn.partition} is not aborted: {refusal}"
            )
        epoch = bumped(txn.producer_epoch)
        try:
            await self.write(leader, txn, MarkerResult.ABORT, epoch, coordinator_epoch)
        except NodeCallFailed as exc:
            raise LeaderNotAvailableError(str(exc)) from exc
        self._done(txn, "abort", None if rec is None else rec.transactional_id)
        return AbortHangingResponse(
            topic=txn.topic, partition=txn.partition, producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch, marker_epoch=epoch,
            first_offset=txn.first_offset, leader=leader,
        )  # fmt: skip

    def _done(self, txn: OpenTransaction, action: str, tid: str | None) -> str:
        self._metrics.hanging_resolved.labels(action=action).inc()
        log.warning(
            "hanging transaction of producer %d epoch %d on %s/%d (from offset %d, open "
            "%d ms, transactional id %r) resolved: %s",
            txn.producer_id, txn.producer_epoch, txn.topic, txn.partition, txn.first_offset,
            txn.age_ms, tid, action,
            extra={"producer_id": txn.producer_id, "topic": txn.topic,
                   "partition": txn.partition, "action": action, "transactional_id": tid},
        )  # fmt: skip
        return action


def _name(txn: OpenTransaction) -> str:
    return f"producer {txn.producer_id} epoch {txn.producer_epoch} on {txn.topic}/{txn.partition}"

