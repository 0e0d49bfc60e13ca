"""Kafka-style concurrency test: many threads run random lifecycles against one coordinator
on shared transactional ids; afterwards the log of transitions must be legal for every id,
and no request may have failed with anything but an expected, catalogued error."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

import httpx

from coordinator_service.transactions.table import can_transition
from eos_protocol.states import TransactionState
from tests.coordinator.helpers import describe, topic
from tests.support.processes import wait_until

EXPECTED = {
    "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE",
    "CONCURRENT_TRANSACTIONS", "INVALID_PRODUCER_ID_MAPPING",
}
THREADS = 8
OPS = 80
IDS = ["c0", "c1", "c2"]
#: An init fences every other thread holding the id, so it is the rare move; the walk
#: then reaches commits (not only aborts and fences) in every run.
OPERATIONS = ["init", "add", "offsets", "commit", "abort"]
WEIGHTS = [1, 5, 2, 3, 1]
#: Share of a thread's moves on "its" id; the rest contend on any id.
AFFINITY = 0.6


def _worker(url: str, seed: int, errors: list[str]) -> None:
    rnd = random.Random(seed)
    own = IDS[seed % len(IDS)]
    producers: dict[str, tuple[int, int]] = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        for _ in range(OPS):
            tid = own if rnd.random() < AFFINITY else rnd.choice(IDS)
            op = rnd.choices(OPERATIONS, weights=WEIGHTS)[0]
            if tid not in producers or op == "init":
                response = c.post(f"/v1/transactions/{tid}/init", json={})
                if response.status_code == 200:
                    body = response.json()
                    producers[tid] = (body["producer_id"], body["producer_epoch"])
            else:
                pid, epoch = producers[tid]
                ident = {"producer_id": pid, "producer_epoch": epoch}
                if op == "add":
                    parts = [{"topic": "cc", "partition": rnd.randrange(4)}]
                    response = c.post(f"/v1/transactions/{tid}/partitions",
                                      json={**ident, "partitions": parts})
                elif op == "offsets":
                    response = c.post(f"/v1/transactions/{tid}/offsets",
                                      json={**ident, "group_id": rnd.choice(["g1", "g2"])})
                else:
                    response = c.post(f"/v1/transactions/{tid}/{op}",
                                      json={**ident, "wait_for_markers": rnd.random() < 0.5})
            if response.status_code not in (200, 201):
                error = response.json()["error"]["code"]
                if error not in EXPECTED:
                    errors.append(f"{op} {tid}: {response.status_code} {response.text}")


def test_random_lifecycles_leave_a_legal_transition_log(coordinator: Any) -> None:
    log: list[tuple[str, TransactionState | None, TransactionState, int]] = []
    coordinator.services.coordinator.listeners.append(
        lambda tid, old, new, epoch: log.append((tid, old, new, epoch))
    )
    with coordinator.client() as c:
        topic(c, "cc", 4)
    errors: list[str] = []
    threads = [
        threading.Thread(target=_worker, args=(coordinator.url, seed, errors))
        for seed in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    wait_until(lambda: not coordinator.services.markers.jobs, timeout=30,
               what="markers to drain")
    by_id: dict[str, list[tuple[TransactionState | None, TransactionState, int]]] = (
        defaultdict(list)
    )
    for tid, old, new, epoch in log:
        by_id[tid].append((old, new, epoch))
    assert set(by_id) == set(IDS)
    counts: dict[TransactionState, int] = defaultdict(int)
    for tid, moves in by_id.items():
        assert moves[0][0] is None and moves[0][1] is TransactionState.EMPTY
        current = moves[0][1]
        last_epoch = moves[0][2]
        for old, new, epoch in moves[1:]:
            assert old is current, f"{tid}: {old} after {current}"
            assert can_transition(old, new), f"{tid}: illegal {old} -> {new}"
            assert epoch >= last_epoch, f"{tid}: epoch went back"
            current, last_epoch = new, epoch
            counts[new] += 1
        with coordinator.client() as c:
            assert describe(c, tid)["state"] == current.value
    # the random walk visited the interesting states
    assert counts[TransactionState.ONGOING] > 0
    assert counts[TransactionState.COMPLETE_COMMIT] > 0
    assert counts[TransactionState.PREPARE_EPOCH_FENCE] > 0
